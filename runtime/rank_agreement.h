// Before step 1 the ranks of a job check that they will train the same run.
// Ranks launched with different seeds, --accumulate values or data files
// would each compute their own thing and average it into garbage, with exit
// status 0 (mpirun -np 1 T --seed 1 : -np 1 T --seed 2). So every rank
// describes what must be equal on all of them as a list of settings (name,
// value as text: the trainer's run() says which, docs/distributed.md lists
// them); one fixed-size record per rank is gathered to every rank
// (MPI_Allgather) and compared with rank 0's, on every rank. Every rank
// finds the same differences, so when there are any they all stop together:
// rank 0 says which, every rank exits 1, and none waits for the others.
#pragma once

#include <string>
#include <vector>

#include "runtime/communicator.h"
#include "runtime/error.h"

namespace napkin::runtime {

struct AgreedSetting {
  std::string name;   // "--seed", "the data"
  std::string value;  // "1", "32,768 bytes, CRC-32C 1a2b3c4d"
};

// An error every rank of a job finds alike from what the ranks agreed on:
// rank 0 says it, and every rank ends with status 1, none waiting for another.
class EveryRankStops : public Error {
 public:
  using Error::Error;
};

// What check_ranks_agree throws on every rank of a job whose ranks differ.
class RanksDisagree : public EveryRankStops {
 public:
  using EveryRankStops::EveryRankStops;
};

// What identifies a file's content, cheaply at any size: its length and a
// CRC-32C of its first and last 64 KiB ("32,768 bytes, CRC-32C 1a2b3c4d").
// A copy that is shorter, longer or another file shows; the path does not
// count (each host may have its own copy).
std::string file_identity(const std::string& path);

// Gathers every rank's `mine` (the same names in the same order on every
// rank) and throws RanksDisagree when any rank's values differ from rank
// 0's, naming each: "rank 1 disagrees with rank 0 on --seed: 2 vs 1".
void check_ranks_agree(Communicator& comm, const std::vector<AgreedSetting>& mine);

}  // namespace napkin::runtime
