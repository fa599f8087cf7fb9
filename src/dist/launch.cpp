// SPDX-License-Identifier: Apache-2.0
#include "dist/launch.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <optional>
#include <unistd.h>

#include "fp4serve/error.h"

extern char** environ;  // POSIX

namespace fp4serve::dist {
namespace {

std::optional<int> integer(const Environment& env, const std::string& name) {
  const auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  const std::string& s = it->second;
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 0) {
    throw UsageError(fmt::format("the launcher's environment variable {}='{}' is not a non-negative integer", name, s));
  }
  return value;
}

struct Names {
  const char* launcher;
  const char* size;
  const char* rank;
  const char* local_rank;
};

// Open MPI sets its own variables and PMIx's; MPICH's hydra sets PMI_*; srun sets SLURM_* (and PMI_* or PMIX_*
// with --mpi). The first family whose rank is set wins, so a launcher's own names come before the generic ones.
constexpr Names kFamilies[] = {
    {"mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"},
    {"pmix", "PMIX_SIZE", "PMIX_RANK", "PMIX_LOCAL_RANK"},
    {"slurm", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"},
};

bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  for (const char c : s) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
    if (!plain) return true;
  }
  return false;
}

std::string shell_quote(const std::string& s) {
  if (!needs_quotes(s)) return s;
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  out += '\'';
  return out;
}

}  // namespace

LaunchInfo detect_launch(const Environment& env) {
  for (const Names& f : kFamilies) {
    const std::optional<int> rank = integer(env, f.rank);
    if (!rank) continue;
    LaunchInfo info;
    info.launched = true;
    info.launcher = f.launcher;
    info.rank = *rank;
    // PMIx alone does not export the size: take Slurm's when srun started us, else leave it to MPI (0 = unknown).
    std::optional<int> size = integer(env, f.size);
    if (!size && std::string_view(f.launcher) == "pmix") size = integer(env, "SLURM_NTASKS");
    info.world_size = size.value_or(0);
    if (size && *size < 1) {
      throw UsageError(fmt::format("the launcher's environment variable {}={} is not a process count", f.size, *size));
    }
    if (size && *rank >= *size) {
      throw UsageError(fmt::format("the launcher's environment says rank {}={} of {}={}: the rank must be below the size",
                                   f.rank, *rank, f.size, *size));
    }
    info.local_rank = integer(env, f.local_rank).value_or(0);
    return info;
  }
  return LaunchInfo{};
}

LaunchInfo detect_launch() {
  Environment env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string name(kv.substr(0, eq));
    for (const Names& f : kFamilies) {
      if (name == f.size || name == f.rank || name == f.local_rank) env.emplace(name, std::string(kv.substr(eq + 1)));
    }
  }
  return detect_launch(env);
}

std::string mpirun_command(int tensor_parallel_size, const std::string& program, int argc, const char* const* argv,
                           bool as_root) {
  std::string cmd = fmt::format("mpirun -np {}", tensor_parallel_size);
  if (as_root) cmd += " --allow-run-as-root";
  cmd += ' ';
  cmd += shell_quote(program);
  for (int i = 0; i < argc; ++i) {
    cmd += ' ';
    cmd += shell_quote(argv[i]);
  }
  return cmd;
}

void check_tensor_parallel_size(int tensor_parallel_size, const LaunchInfo& launch, const std::string& mpirun_hint) {
  if (tensor_parallel_size < 1) {
    throw UsageError(fmt::format("--tensor-parallel-size {} is not a rank count: expected 1 or more",
                                 tensor_parallel_size));
  }
  if (!launch.launched) {
    if (tensor_parallel_size == 1) return;
    throw UsageError(fmt::format("--tensor-parallel-size {} needs one process per rank, started by a launcher "
                                 "(no OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or SLURM_PROCID is set); run:\n  {}",
                                 tensor_parallel_size, mpirun_hint));
  }
  if (launch.world_size != 0 && launch.world_size != tensor_parallel_size) {
    throw UsageError(fmt::format("--tensor-parallel-size {} does not match the {} processes {} started (world size "
                                 "{}): launch exactly {} processes, or pass --tensor-parallel-size {}",
                                 tensor_parallel_size, launch.world_size, launch.launcher, launch.world_size,
                                 tensor_parallel_size, launch.world_size));
  }
}

}  // namespace fp4serve::dist
