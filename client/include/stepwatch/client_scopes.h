// stepwatch C++ client: StepScope and PhaseScope, which time a step, its phases and its named
// sections and send the step's event through a Reporter when the step ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "stepwatch/client_record.h"
#include "stepwatch/client_reporter.h"
#include "stepwatch/detail/reporter_send.h"

namespace stepwatch {

class PhaseScope;

// Times one step; sends its event when destroyed (unless Cancel()ed).
class StepScope {
 public:
  // Step number: one more than the previous step this reporter's scopes reported (0 first).
  explicit StepScope(Reporter& reporter, int64_t samples = -1) noexcept
      : StepScope(reporter, reporter.next_step(), samples) {}
  StepScope(Reporter& reporter, int64_t step, int64_t samples) noexcept
      : reporter_(reporter), step_(step), samples_(samples), start_(Clock::now()) {}
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

  void set_samples(int64_t samples) noexcept { samples_ = samples; }
  // The step failed or is not to be reported.
  void Cancel() noexcept { cancelled_ = true; }
  int64_t step() const noexcept { return step_; }

 private:
  friend class PhaseScope;
  using Clock = std::chrono::steady_clock;

  Reporter& reporter_;
  int64_t step_;
  int64_t samples_;
  Clock::time_point start_;
  Clock::duration phase_time_[3] = {};
  PhaseScope* active_ = nullptr;
  bool cancelled_ = false;
  // Named sections: the time of each in this step, those entered in it, those open now, and for
  // an open one the phase it counts toward and that phase's time when it was entered.
  Clock::duration section_time_[kMaxSections] = {};
  uint16_t section_used_ = 0;
  uint16_t section_open_ = 0;
  int8_t section_phase_[kMaxSections] = {};
  Clock::duration section_base_[kMaxSections] = {};
};

// Times a phase or a named section of a step.
//
// Phases (Phase::kData, kCompute, kComm, or the names "data", "compute", "comm") nest: an inner
// phase pauses the outer one, so communication inside compute is not counted as compute.
//
// A named section (any other valid name: "forward", "backward", "optimizer", ...) is reported in
// the event's "sections" and is not a phase of its own: its time counts toward compute_s, unless
// it is entered inside a data or comm phase, whose time it then is. Its own time is the time that
// counts toward that phase while it is open, so a data or comm phase inside it (waiting for other
// ranks inside "backward") is left out of it; a section inside another section counts in both.
// Using one name several times in a step adds up; the same name inside itself counts once. An
// invalid name (ValidateSectionName) or a 17th name on a Reporter times nothing: ok() is false and
// one warning goes to stderr (nothing here throws).
class PhaseScope {
 public:
  PhaseScope(StepScope& step, Phase phase) noexcept : step_(step) {
    EnterPhase(static_cast<int>(phase));
  }
  PhaseScope(StepScope& step, std::string_view name) noexcept;
  PhaseScope(StepScope& step, const char* name) noexcept
      : PhaseScope(step, std::string_view(name != nullptr ? name : "")) {}
  PhaseScope(StepScope& step, const std::string& name) noexcept
      : PhaseScope(step, std::string_view(name)) {}
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

  // False when the name was refused: the scope times nothing.
  bool ok() const noexcept { return ok_; }

 private:
  friend class StepScope;

  void EnterPhase(int index) noexcept {
    index_ = index;
    parent_ = step_.active_;
    const auto now = StepScope::Clock::now();
    if (parent_ != nullptr) step_.phase_time_[parent_->index_] += now - parent_->start_;
    step_.active_ = this;
    start_ = now;
  }

  StepScope& step_;
  int index_ = -1;  // the phase this scope is in the chain of open phases as; -1: not in it
  PhaseScope* parent_ = nullptr;
  StepScope::Clock::time_point start_;
  int section_ = -1;  // the section this scope times; -1: none
  bool ok_ = true;
};
inline PhaseScope::PhaseScope(StepScope& step, std::string_view name) noexcept : step_(step) {
  static constexpr std::string_view kPhaseNames[] = {"data", "compute", "comm"};
  for (int p = 0; p < 3; ++p) {
    if (name == kPhaseNames[p]) {
      EnterPhase(p);
      return;
    }
  }
  const char* why = nullptr;
  const int id = step.reporter_.SectionId(name, &why);
  if (id < 0) {
    ok_ = false;
    step.reporter_.WarnSection(name, why);
    return;
  }
  const uint16_t bit = static_cast<uint16_t>(1u << id);
  step_.section_used_ = static_cast<uint16_t>(step_.section_used_ | bit);
  if ((step_.section_open_ & bit) != 0) return;  // inside itself: the outer scope times it
  step_.section_open_ = static_cast<uint16_t>(step_.section_open_ | bit);
  section_ = id;
  int phase = 1;  // outside any phase: compute
  if (step_.active_ == nullptr) {
    EnterPhase(phase);  // in the chain as compute, so that phases inside it pause it
  } else {
    // Inside a phase: the section is that phase's time. Bring its count up to now.
    PhaseScope* active = step_.active_;
    const auto now = StepScope::Clock::now();
    step_.phase_time_[active->index_] += now - active->start_;
    active->start_ = now;
    phase = active->index_;
  }
  step_.section_phase_[id] = static_cast<int8_t>(phase);
  step_.section_base_[id] = step_.phase_time_[phase];
}

inline PhaseScope::~PhaseScope() {
  const auto now = StepScope::Clock::now();
  if (index_ >= 0) {
    // In the chain (a phase, or a section entered outside any phase).
    step_.phase_time_[index_] += now - start_;
    if (parent_ != nullptr) parent_->start_ = now;
    step_.active_ = parent_;
  } else if (section_ >= 0 && step_.active_ != nullptr) {
    PhaseScope* active = step_.active_;
    step_.phase_time_[active->index_] += now - active->start_;
    active->start_ = now;
  }
  if (section_ >= 0) {
    const int phase = step_.section_phase_[section_];
    step_.section_time_[section_] += step_.phase_time_[phase] - step_.section_base_[section_];
    step_.section_open_ = static_cast<uint16_t>(step_.section_open_ & ~(1u << section_));
  }
}

inline StepScope::~StepScope() {
  if (cancelled_) return;
  const auto end = Clock::now();
  if (active_ != nullptr) {
    // A phase still open (scopes destroyed out of order): count it up to now.
    phase_time_[active_->index_] += end - active_->start_;
    active_->start_ = end;
  }
  for (int id = 0; id < kMaxSections; ++id) {
    if ((section_open_ & (1u << id)) == 0) continue;
    // A section still open (likewise): up to now.
    section_time_[id] += phase_time_[section_phase_[id]] - section_base_[id];
    section_base_[id] = phase_time_[section_phase_[id]];
  }
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  StepRecord r;
  r.step = step_;
  r.step_s = seconds(end - start_);
  if (phase_time_[0].count() > 0) r.data_s = seconds(phase_time_[0]);
  if (phase_time_[1].count() > 0) r.compute_s = seconds(phase_time_[1]);
  if (phase_time_[2].count() > 0) r.comm_s = seconds(phase_time_[2]);
  if (samples_ >= 0) r.samples = samples_;
  for (int id = 0; id < kMaxSections; ++id) {
    if ((section_used_ & (1u << id)) != 0) r.SetSection(id, seconds(section_time_[id]));
  }
  reporter_.next_step_.store(step_ + 1, std::memory_order_relaxed);
  reporter_.Send(r);
}

}  // namespace stepwatch
