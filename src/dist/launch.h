// SPDX-License-Identifier: Apache-2.0
// How this process was started: alone, or as one rank of a run launched by mpirun (Open MPI), a PMI/PMIx
// launcher (MPICH's mpiexec/hydra, srun --mpi=pmix) or Slurm's srun. Read from the environment the launcher
// sets, before MPI is initialised, so that a bad --tensor-parallel-size is refused without starting MPI.
#pragma once

#include <map>
#include <string>

namespace fp4serve::dist {

struct LaunchInfo {
  bool launched = false;  ///< a launcher set the variables below; false for a plain `fp4serve …`
  std::string launcher;   ///< "mpirun" (OMPI_*), "pmi", "pmix", "slurm", or "" when not launched
  int world_size = 1;     ///< processes in the run
  int rank = 0;           ///< this process, 0 … world_size − 1
  int local_rank = 0;     ///< this process among those on the same node: the CUDA device it drives
};

/// The environment variables detect_launch reads, as a map so that tests pass their own.
using Environment = std::map<std::string, std::string>;

/// This process's launch, from (in order of precedence) OMPI_COMM_WORLD_SIZE / _RANK / _LOCAL_RANK (Open MPI),
/// PMI_SIZE / PMI_RANK (MPICH hydra; MPI_LOCALRANKID for the local rank), PMIX_RANK with OMPI_COMM_WORLD_SIZE
/// or PMIX_SIZE (PMIx), SLURM_NTASKS / SLURM_PROCID / SLURM_LOCALID (srun). Throws UsageError naming the
/// variable and its value when one is set but is not an integer, or when rank ∉ [0, size).
LaunchInfo detect_launch(const Environment& env);
/// detect_launch over this process's environment.
LaunchInfo detect_launch();

/// The command that runs `args` (argv without the program name, with "--tensor-parallel-size N" in it) on
/// N ranks of this machine, as the refusal for N > 1 without a launcher prints it:
/// "mpirun -np N [--allow-run-as-root] <program> args…" (shell-quoted where needed).
std::string mpirun_command(int tensor_parallel_size, const std::string& program, int argc, const char* const* argv,
                           bool as_root);

/// Checks --tensor-parallel-size against the launch: size ≥ 1; size > 1 needs a launcher (UsageError whose
/// message carries `mpirun_hint`, the command to run instead); a launched run's world size must equal it
/// (UsageError naming both). Returns normally when they agree (including size 1 without a launcher).
void check_tensor_parallel_size(int tensor_parallel_size, const LaunchInfo& launch, const std::string& mpirun_hint);

}  // namespace fp4serve::dist
