// line_probe: prints how many nanoseconds a cache line takes to cross
// between two CPUs right now (bench/placement.h), for scripts that want to
// know which of the VM's placements a measurement ran in
// (bench/compare_providers.sh brackets each round with it).
//
//   line_probe [A,B]     (default 0,1)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench/placement.h"

int main(int argc, char** argv) {
  int a = 0, b = 1;
  if (argc > 2 || (argc == 2 && std::sscanf(argv[1], "%d,%d", &a, &b) != 2)) {
    std::fprintf(stderr, "usage: line_probe [A,B]   (two CPU numbers, default 0,1)\n");
    return 2;
  }
  auto ns = zsock::bench::LineTransferNs(a, b);
  if (!ns.ok()) {
    std::fprintf(stderr, "line_probe: %s\n", std::string(ns.status().message()).c_str());
    return 1;
  }
  std::printf("%.0f\n", *ns);
  return 0;
}
