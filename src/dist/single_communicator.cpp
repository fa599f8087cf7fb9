// SPDX-License-Identifier: Apache-2.0
#include <cstdlib>
#include <cstring>

#include "dist/communicator.h"

namespace fp4serve::dist {
namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  bool device_memory() const override { return false; }
  void all_reduce_sum(float*, std::size_t) override {}
  void all_gather(const void* send, void* recv, std::size_t bytes) override {
    if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
  }
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

}  // namespace fp4serve::dist
