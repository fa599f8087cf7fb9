// SPDX-License-Identifier: Apache-2.0
// Launcher detection from the variables each launcher sets, and the --tensor-parallel-size checks.
#include "dist/launch.h"

#include <gtest/gtest.h>

#include "fp4serve/error.h"

namespace fp4serve::dist {
namespace {

TEST(DetectLaunch, PlainProcessIsNotLaunched) {
  const LaunchInfo info = detect_launch(Environment{{"HOME", "/root"}});
  EXPECT_FALSE(info.launched);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.rank, 0);
}

TEST(DetectLaunch, OpenMpi) {
  const LaunchInfo info = detect_launch(Environment{{"OMPI_COMM_WORLD_SIZE", "3"},
                                                    {"OMPI_COMM_WORLD_RANK", "2"},
                                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                    {"PMIX_RANK", "2"}});
  EXPECT_TRUE(info.launched);
  EXPECT_EQ(info.launcher, "mpirun");
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.local_rank, 1);
}

TEST(DetectLaunch, PmiHydra) {
  const LaunchInfo info =
      detect_launch(Environment{{"PMI_SIZE", "4"}, {"PMI_RANK", "3"}, {"MPI_LOCALRANKID", "3"}});
  EXPECT_EQ(info.launcher, "pmi");
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.local_rank, 3);
}

TEST(DetectLaunch, PmixTakesSlurmsSizeOrLeavesItToMpi) {
  const LaunchInfo with_slurm = detect_launch(Environment{{"PMIX_RANK", "1"}, {"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "1"}});
  EXPECT_EQ(with_slurm.launcher, "pmix");
  EXPECT_EQ(with_slurm.world_size, 8);
  EXPECT_EQ(with_slurm.rank, 1);
  const LaunchInfo alone = detect_launch(Environment{{"PMIX_RANK", "5"}});
  EXPECT_TRUE(alone.launched);
  EXPECT_EQ(alone.world_size, 0);  // unknown until MPI_Init
  EXPECT_EQ(alone.rank, 5);
}

TEST(DetectLaunch, Slurm) {
  const LaunchInfo info =
      detect_launch(Environment{{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(info.launcher, "slurm");
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.local_rank, 0);
}

TEST(DetectLaunch, MalformedVariablesAreNamed) {
  try {
    detect_launch(Environment{{"OMPI_COMM_WORLD_SIZE", "two"}, {"OMPI_COMM_WORLD_RANK", "0"}});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_SIZE='two'"), std::string::npos) << e.what();
  }
  try {
    detect_launch(Environment{{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "2"}});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_PROCID=2 of SLURM_NTASKS=2"), std::string::npos) << e.what();
  }
}

TEST(MpirunCommand, QuotesWhatTheShellWouldSplit) {
  const char* argv[] = {"generate", "-m", "/models/my model", "-p", "it's", "--tensor-parallel-size", "2"};
  EXPECT_EQ(mpirun_command(2, "/usr/bin/fp4serve", 7, argv, false),
            "mpirun -np 2 /usr/bin/fp4serve generate -m '/models/my model' -p 'it'\\''s' --tensor-parallel-size 2");
  EXPECT_EQ(mpirun_command(4, "fp4serve", 0, argv, true), "mpirun -np 4 --allow-run-as-root fp4serve");
}

TEST(CheckTensorParallelSize, AcceptsWhatTheLaunchProvides) {
  EXPECT_NO_THROW(check_tensor_parallel_size(1, LaunchInfo{}, "unused"));
  LaunchInfo two;
  two.launched = true;
  two.launcher = "mpirun";
  two.world_size = 2;
  EXPECT_NO_THROW(check_tensor_parallel_size(2, two, "unused"));
}

TEST(CheckTensorParallelSize, WithoutALauncherPrintsTheMpirunCommand) {
  try {
    check_tensor_parallel_size(2, LaunchInfo{}, "mpirun -np 2 fp4serve generate --tensor-parallel-size 2");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("needs one process per rank"), std::string::npos) << what;
    EXPECT_NE(what.find("mpirun -np 2 fp4serve generate --tensor-parallel-size 2"), std::string::npos) << what;
  }
}

TEST(CheckTensorParallelSize, WorldSizeMismatchNamesBoth) {
  LaunchInfo three;
  three.launched = true;
  three.launcher = "mpirun";
  three.world_size = 3;
  try {
    check_tensor_parallel_size(2, three, "unused");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--tensor-parallel-size 2 does not match the 3 processes mpirun started"), std::string::npos)
        << what;
  }
  EXPECT_THROW(check_tensor_parallel_size(0, LaunchInfo{}, "unused"), UsageError);
}

}  // namespace
}  // namespace fp4serve::dist
