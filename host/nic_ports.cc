#include "host/nic_ports.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/file.h"
#include "common/log.h"

namespace stepwatch::host {
namespace {

namespace fs = std::filesystem;

// sysfs attribute files are one short line; anything longer is not one.
constexpr size_t kMaxAttributeBytes = 4096;
// Entries listed per directory: sysfs directories here hold a handful.
constexpr size_t kMaxListedEntries = 4096;
// port_rcv_data and port_xmit_data count 4-byte words (IBA PortCounters).
constexpr uint64_t kBytesPerWord = 4;
constexpr double kBitsPerByte = 8;

bool AllDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Names of the entries of `dir` (at most kMaxListedEntries), sorted; empty when unlistable.
std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator() && names.size() < kMaxListedEntries;
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Port directories are numbered from 1; in number order ("2" before "10").
std::vector<std::string> PortNames(const std::string& dir) {
  std::vector<std::string> ports;
  for (std::string& name : ListDir(dir)) {
    if (AllDigits(name) && name.size() <= 4) ports.push_back(std::move(name));
  }
  std::sort(ports.begin(), ports.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return ports;
}

using CounterSetter = void (v1::NicPort::*)(uint64_t);
struct CounterFile {
  const char* file;
  CounterSetter set;
  uint64_t scale;
};
const CounterFile kCounterFiles[] = {
    {"symbol_error", &v1::NicPort::set_symbol_errors_total, 1},
    {"port_rcv_errors", &v1::NicPort::set_receive_errors_total, 1},
    {"link_downed", &v1::NicPort::set_link_downed_total, 1},
    {"port_xmit_discards", &v1::NicPort::set_transmit_discards_total, 1},
    {"port_xmit_wait", &v1::NicPort::set_transmit_wait_total, 1},
    {"port_rcv_data", &v1::NicPort::set_received_bytes_total, kBytesPerWord},
    {"port_xmit_data", &v1::NicPort::set_transmitted_bytes_total, kBytesPerWord},
};

// hw_counters entries that are settings rather than counts.
bool IsHwSetting(absl::string_view name) { return name == "lifespan"; }

}  // namespace

absl::StatusOr<uint32_t> ParseIbPortState(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  const size_t colon = text.find(':');
  const absl::string_view number =
      absl::StripAsciiWhitespace(colon == absl::string_view::npos ? text : text.substr(0, colon));
  uint32_t state = 0;
  if (!AllDigits(number) || number.size() > 3 || !absl::SimpleAtoi(number, &state)) {
    return absl::InvalidArgumentError(absl::StrCat("not a port state: \"", text, "\""));
  }
  return state;
}

absl::StatusOr<IbRate> ParseIbRate(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("not a port rate: \"", text, "\""));
  };
  const size_t unit = text.find(" Gb/sec");
  if (unit == absl::string_view::npos) return bad();
  double gigabits = 0;
  if (!absl::SimpleAtod(text.substr(0, unit), &gigabits) || !std::isfinite(gigabits) ||
      gigabits < 0 || gigabits > 1e6) {
    return bad();
  }
  IbRate rate;
  rate.bytes_per_second = gigabits * 1e9 / kBitsPerByte;
  absl::string_view rest = absl::StripAsciiWhitespace(text.substr(unit + 7));
  if (absl::ConsumePrefix(&rest, "(")) {
    const size_t x = rest.find('X');
    uint32_t width = 0;
    if (x != absl::string_view::npos && AllDigits(rest.substr(0, x)) && x <= 3 &&
        absl::SimpleAtoi(rest.substr(0, x), &width) && width > 0) {
      rate.link_width = width;
    }
  }
  return rate;
}

absl::StatusOr<uint64_t> ParseSysfsCounter(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  uint64_t value = 0;
  if (!AllDigits(text) || !absl::SimpleAtoi(text, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a counter: \"", text.substr(0, 32), text.size() > 32 ? "...\"" : "\""));
  }
  return value;
}

bool IsNicName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNicNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

void NicPortReader::Read(v1::HostSample* sample) {
  const std::string class_dir = root_ + "/sys/class/infiniband";
  uint32_t omitted = 0;
  for (const std::string& device : ListDir(class_dir)) {
    // ":" joins device and port; a name that cannot be a label value safely is skipped.
    if (!IsNicName(device)) continue;
    const std::string ports_dir = absl::StrCat(class_dir, "/", device, "/ports");
    for (const std::string& port : PortNames(ports_dir)) {
      const std::string name = absl::StrCat(device, ":", port);
      if (name.size() > kMaxNicNameBytes) continue;
      if (static_cast<size_t>(sample->nic_ports_size()) >= max_ports_) {
        ++omitted;
        continue;
      }
      v1::NicPort* p = sample->add_nic_ports();
      p->set_device(name);
      ReadPort(absl::StrCat(ports_dir, "/", port), p);
    }
  }
  sample->set_nic_ports_omitted(omitted);
  const size_t count = static_cast<size_t>(sample->nic_ports_size());
  if (!read_before_ || count != last_port_count_) {
    if (count > 0 || read_before_) {
      SW_LOG_INFO << "InfiniBand/RoCE ports: " << count << " read"
                  << (omitted > 0 ? absl::StrCat(", ", omitted, " beyond the bound of ", max_ports_,
                                                 " not read")
                                  : std::string());
    }
    read_before_ = true;
    last_port_count_ = count;
  }
}

void NicPortReader::ReadPort(const std::string& dir, v1::NicPort* port) {
  const auto read = [&](const std::string& file) {
    return ReadFile(absl::StrCat(dir, "/", file), kMaxAttributeBytes);
  };
  // link_layer is absent before Linux 3.x RoCE support: not a failure.
  if (absl::StatusOr<std::string> text = read("link_layer"); text.ok()) {
    const absl::string_view layer = absl::StripAsciiWhitespace(*text);
    if (IsNicName(layer)) port->set_link_layer(std::string(layer));
  }
  const auto parsed = [&](const std::string& file, auto parse, auto apply) {
    absl::StatusOr<std::string> text = read(file);
    if (!text.ok()) return Unavailable(file, text.status().message(), port);
    auto value = parse(*text);
    if (!value.ok()) {
      return Unavailable(file, absl::StrCat(dir, "/", file, ": ", value.status().message()), port);
    }
    apply(*value);
  };
  parsed("state", ParseIbPortState, [&](uint32_t v) { port->set_state(v); });
  parsed("phys_state", ParseIbPortState, [&](uint32_t v) { port->set_physical_state(v); });
  parsed("rate", ParseIbRate, [&](const IbRate& r) {
    port->set_rate_bytes_per_second(r.bytes_per_second);
    if (r.link_width) port->set_link_width(*r.link_width);
  });
  for (const CounterFile& c : kCounterFiles) {
    parsed(absl::StrCat("counters/", c.file), ParseSysfsCounter, [&](uint64_t v) {
      const uint64_t max = std::numeric_limits<uint64_t>::max() / c.scale;
      (port->*c.set)(v > max ? std::numeric_limits<uint64_t>::max() : v * c.scale);
    });
  }
  ReadHwCounters(absl::StrCat(dir, "/hw_counters"), port);
}

void NicPortReader::ReadHwCounters(const std::string& dir, v1::NicPort* port) {
  auto* counters = port->mutable_hw_counters();
  for (const std::string& name : ListDir(dir)) {
    if (counters->size() >= static_cast<int>(kMaxNicHwCounters)) break;
    if (!IsNicName(name) || absl::StrContains(name, '.') || IsHwSetting(name)) continue;
    const std::string path = absl::StrCat(dir, "/", name);
    absl::StatusOr<std::string> text = ReadFile(path, kMaxAttributeBytes);
    if (!text.ok()) {
      Unavailable("hw_counters", text.status().message(), port);
      continue;
    }
    absl::StatusOr<uint64_t> value = ParseSysfsCounter(*text);
    if (!value.ok()) {
      Unavailable("hw_counters", absl::StrCat(path, ": ", value.status().message()), port);
      continue;
    }
    (*counters)[name] = *value;
  }
}

void NicPortReader::Unavailable(const std::string& reading, absl::string_view why,
                                v1::NicPort* port) {
  ++unavailable_total_;
  // One entry per reading: several unreadable hw_counters files count once.
  const auto& listed = port->unavailable();
  if (std::find(listed.begin(), listed.end(), reading) == listed.end()) {
    port->add_unavailable(reading);
  }
  if (logged_.insert(reading).second) {
    SW_LOG_WARNING << "NIC reading " << reading << " unavailable (" << why
                   << "); further failures of this reading are counted, not logged";
  }
}

}  // namespace stepwatch::host
