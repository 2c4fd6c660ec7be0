#include "host/proc_parse.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace stepwatch::host {
namespace {

std::vector<absl::string_view> Fields(absl::string_view line) {
  return absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
}

// Parses a decimal or 0x-prefixed hexadecimal unsigned number.
bool ParseUint(absl::string_view text, uint64_t* out) {
  text = absl::StripAsciiWhitespace(text);
  if (absl::ConsumePrefix(&text, "0x") || absl::ConsumePrefix(&text, "0X")) {
    if (text.empty()) return false;
    return absl::SimpleHexAtoi(text, out);
  }
  return absl::SimpleAtoi(text, out);
}

}  // namespace

absl::StatusOr<CpuTimes> ParseProcStat(absl::string_view text) {
  CpuTimes times;
  bool have_total = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "cpu")) continue;
    std::vector<absl::string_view> f = Fields(line);
    if (f.empty()) continue;
    if (f[0] == "cpu") {
      // user nice system idle iowait irq softirq steal [guest guest_nice]; guest time is already
      // counted in user and nice.
      if (f.size() < 5) return absl::InvalidArgumentError("short cpu line");
      uint64_t v[8] = {};
      const size_t n = std::min<size_t>(8, f.size() - 1);
      for (size_t i = 0; i < n; ++i) {
        if (!absl::SimpleAtoi(f[i + 1], &v[i])) {
          return absl::InvalidArgumentError(absl::StrCat("bad number '", f[i + 1], "'"));
        }
      }
      uint64_t total = 0;
      for (uint64_t x : v) total += x;
      const uint64_t idle = v[3] + v[4];
      times.total = total;
      times.busy = total - idle;
      have_total = true;
    } else if (f[0].size() > 3 && absl::ascii_isdigit(f[0][3])) {
      ++times.cpu_count;
    }
  }
  if (!have_total) return absl::InvalidArgumentError("no aggregate cpu line");
  return times;
}

std::optional<double> CpuUtilization(const CpuTimes& before, const CpuTimes& after) {
  if (after.total <= before.total || after.busy < before.busy) return std::nullopt;
  const double busy = static_cast<double>(after.busy - before.busy);
  const double total = static_cast<double>(after.total - before.total);
  const double ratio = busy / total;
  return ratio > 1.0 ? 1.0 : ratio;
}

absl::StatusOr<MemInfo> ParseMeminfo(absl::string_view text) {
  MemInfo info;
  bool have_total = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> f = Fields(line);
    if (f.size() < 2) continue;
    const bool is_total = f[0] == "MemTotal:";
    const bool is_available = f[0] == "MemAvailable:";
    if (!is_total && !is_available) continue;
    uint64_t value = 0;
    if (!absl::SimpleAtoi(f[1], &value)) {
      return absl::InvalidArgumentError(absl::StrCat("bad number in '", line, "'"));
    }
    // The kernel writes "kB" and means KiB.
    if (f.size() >= 3 && f[2] == "kB") value *= 1024;
    if (is_total) {
      info.total_bytes = value;
      have_total = true;
    } else {
      info.available_bytes = value;
    }
  }
  if (!have_total) return absl::InvalidArgumentError("no MemTotal");
  return info;
}

absl::StatusOr<NetTotals> ParseNetDev(absl::string_view text) {
  NetTotals totals;
  int interfaces = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    // "  eth0: 1234 ..." (large counters may touch the colon: "eth0:1234").
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    absl::string_view name = absl::StripAsciiWhitespace(line.substr(0, colon));
    if (name.empty() || absl::StrContains(name, '|')) continue;  // header lines
    std::vector<absl::string_view> f = Fields(line.substr(colon + 1));
    if (f.size() < 9) {
      return absl::InvalidArgumentError(absl::StrCat("short line for ", name));
    }
    uint64_t rx = 0, tx = 0;
    if (!absl::SimpleAtoi(f[0], &rx) || !absl::SimpleAtoi(f[8], &tx)) {
      return absl::InvalidArgumentError(absl::StrCat("bad number for ", name));
    }
    ++interfaces;
    if (name == "lo") continue;
    totals.receive_bytes += rx;
    totals.transmit_bytes += tx;
  }
  if (interfaces == 0) return absl::InvalidArgumentError("no interfaces");
  return totals;
}

absl::StatusOr<uint64_t> ParseResctrlCounter(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return absl::UnavailableError(absl::StrCat("resctrl counter: '", text, "'"));
  }
  return value;
}

absl::StatusOr<PerfFormatField> ParsePerfFormat(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (!absl::ConsumePrefix(&text, "config:")) {
    return absl::InvalidArgumentError(absl::StrCat("perf format: unsupported '", text, "'"));
  }
  PerfFormatField field;
  for (absl::string_view range : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> bounds = absl::StrSplit(range, '-');
    int low = 0, high = 0;
    if (!absl::SimpleAtoi(bounds.first, &low)) {
      return absl::InvalidArgumentError(absl::StrCat("perf format: bad range '", range, "'"));
    }
    high = low;
    if (!bounds.second.empty() && !absl::SimpleAtoi(bounds.second, &high)) {
      return absl::InvalidArgumentError(absl::StrCat("perf format: bad range '", range, "'"));
    }
    if (low < 0 || high < low || high > 63) {
      return absl::InvalidArgumentError(absl::StrCat("perf format: bad range '", range, "'"));
    }
    field.bit_ranges.emplace_back(low, high);
  }
  return field;
}

absl::StatusOr<uint64_t> ParsePerfEventConfig(
    absl::string_view event, const std::vector<std::pair<std::string, std::string>>& formats) {
  uint64_t config = 0;
  for (absl::string_view term : absl::StrSplit(absl::StripAsciiWhitespace(event), ',')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(term, '=');
    uint64_t value = 1;  // a bare term sets its field to 1
    if (!kv.second.empty() && !ParseUint(kv.second, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("perf event: bad value in '", term, "'"));
    }
    const std::string* format = nullptr;
    for (const auto& [name, text] : formats) {
      if (name == kv.first) format = &text;
    }
    if (format == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("perf event: no format for '", kv.first, "'"));
    }
    absl::StatusOr<PerfFormatField> field = ParsePerfFormat(*format);
    if (!field.ok()) return field.status();
    // Spread the value's bits over the ranges, low bits first.
    int shift = 0;
    for (const auto& [low, high] : field->bit_ranges) {
      const int width = high - low + 1;
      const uint64_t mask = width >= 64 ? ~0ull : ((1ull << width) - 1);
      config |= ((shift >= 64 ? 0 : (value >> shift)) & mask) << low;
      shift += width;
    }
  }
  return config;
}

absl::StatusOr<double> ParsePerfUnitBytes(absl::string_view unit) {
  unit = absl::StripAsciiWhitespace(unit);
  if (unit == "B" || unit == "Bytes" || unit == "bytes") return 1.0;
  if (unit == "KiB") return 1024.0;
  if (unit == "MiB") return 1024.0 * 1024.0;
  if (unit == "GiB") return 1024.0 * 1024.0 * 1024.0;
  return absl::InvalidArgumentError(absl::StrCat("perf unit is not bytes: '", unit, "'"));
}

absl::StatusOr<int> ParseFirstCpu(absl::string_view cpumask) {
  cpumask = absl::StripAsciiWhitespace(cpumask);
  const size_t end = cpumask.find_first_of(",-");
  int cpu = 0;
  if (!absl::SimpleAtoi(cpumask.substr(0, end), &cpu) || cpu < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad cpumask '", cpumask, "'"));
  }
  return cpu;
}

}  // namespace stepwatch::host
