// The MPI all-reduce this machine runs, measured apart from any trainer:
// MPI_Allreduce of f32 in place (what runtime/gradient_stage.cpp calls) over
// sizes from 64 KiB to 64 MiB, the median of 9 after 2 warm-ups, as time
// and as ring bus bandwidth, 2(N-1)/N x bytes / time (nccl-tests'
// convention, the one analysis/distributed.h's interconnect rows use).
// bench/data_parallel.sh builds it with mpicxx and runs it on 2 ranks; its
// 16 MiB figure is the `shm` interconnect row's bandwidth.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (rank == 0) std::printf("%12s %12s %14s\n", "bytes", "median ms", "bus GB/s");
  for (long bytes = 64L << 10; bytes <= 64L << 20; bytes *= 4) {
    std::vector<float> data(static_cast<size_t>(bytes / 4), 1.0f);
    std::vector<double> times;
    for (int i = 0; i < 11; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);  // the slowest rank's
      if (i >= 2) times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    double median = times[times.size() / 2];
    if (rank == 0)
      std::printf("%12ld %12.3f %14.3f\n", bytes, median * 1e3, 2.0 * (ranks - 1) / ranks * bytes / median / 1e9);
  }
  MPI_Finalize();
  return 0;
}
