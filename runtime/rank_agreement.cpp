#include "runtime/rank_agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "runtime/checkpoint.h"
#include "runtime/dataset.h"
#include "runtime/mapped_file.h"

namespace napkin::runtime {

namespace {

// A rank's record: kSlots slots of kSlotBytes, setting i in slot i as
// "name\0value", zero-padded. Fixed, so that ranks of different trainers
// still gather the same number of bytes.
constexpr size_t kSlots = 32, kSlotBytes = 160;
constexpr size_t kRecordBytes = kSlots * kSlotBytes;
// Differences listed one by one; the rest are counted.
constexpr size_t kListed = 8;

std::string record_of(const std::vector<AgreedSetting>& settings) {
  if (settings.size() > kSlots) throw std::logic_error("check_ranks_agree: more settings than slots");
  std::string record(kRecordBytes, '\0');
  for (size_t i = 0; i < settings.size(); ++i) {
    const AgreedSetting& s = settings[i];
    if (s.name.size() + 40 >= kSlotBytes) throw std::logic_error("check_ranks_agree: setting name too long: " + s.name);
    std::string value = s.value;
    // A long value (many data files) is cut, its checksum kept: still compared whole.
    if (s.name.size() + 1 + value.size() >= kSlotBytes)
      value = value.substr(0, kSlotBytes - s.name.size() - 32) +
              fmt::format("... (CRC-32C {:08x})", crc32c(s.value.data(), s.value.size()));
    std::memcpy(&record[i * kSlotBytes], s.name.data(), s.name.size());
    std::memcpy(&record[i * kSlotBytes + s.name.size() + 1], value.data(), value.size());
  }
  return record;
}

// Slot `i` of `record` as a setting.
AgreedSetting slot(const char* record, size_t i) {
  const char* name = record + i * kSlotBytes;
  const size_t name_length = strnlen(name, kSlotBytes);
  const char* value = name + std::min(name_length + 1, kSlotBytes);
  return {std::string(name, name_length), std::string(value, strnlen(value, kSlotBytes - (value - name)))};
}

}  // namespace

std::string file_identity(const std::string& path) {
  constexpr size_t kEnd = 64 * 1024;
  MappedFile file(path);
  const size_t head = std::min(kEnd, file.size()), tail = std::min(kEnd, file.size() - head);
  uint32_t crc = 0;
  if (file.size() > 0) crc = crc32c(file.data() + file.size() - tail, tail, crc32c(file.data(), head));
  file.check_intact();
  return fmt::format("{} bytes, CRC-32C {:08x}", with_commas(static_cast<int64_t>(file.size())), crc);
}

void check_ranks_agree(Communicator& comm, const std::vector<AgreedSetting>& mine) {
  const int ranks = comm.size();
  if (ranks == 1) return;
  const std::string record = record_of(mine);
  std::string all(kRecordBytes * static_cast<size_t>(ranks), '\0');
  comm.set_activity("before step 1, comparing the ranks' settings");
  comm.all_gather(record.data(), static_cast<int64_t>(kRecordBytes), all.data());
  std::vector<std::string> differences;
  for (int r = 1; r < ranks; ++r) {
    const char* theirs = all.data() + static_cast<size_t>(r) * kRecordBytes;
    for (size_t i = 0; i < kSlots; ++i) {
      if (std::memcmp(theirs + i * kSlotBytes, all.data() + i * kSlotBytes, kSlotBytes) == 0) continue;
      const AgreedSetting zero = slot(all.data(), i), other = slot(theirs, i);
      // Another build of the trainer may list other settings: then the names differ too.
      const std::string what = other.name == zero.name ? zero.name : zero.name + " (rank " + std::to_string(r) +
                                                                         " compares " + other.name + ")";
      differences.push_back(fmt::format("rank {} disagrees with rank 0 on {}: {} vs {}", r, what, other.value, zero.value));
    }
  }
  if (differences.empty()) return;
  std::string message = differences.front();
  for (size_t i = 1; i < differences.size() && i < kListed; ++i) message += "\n  " + differences[i];
  if (differences.size() > kListed) message += fmt::format("\n  and {} more", differences.size() - kListed);
  throw RanksDisagree(message + "\n  every rank of a job must train the same run: give every rank the same flags and "
                                "the same data (nothing was trained)");
}

}  // namespace napkin::runtime
