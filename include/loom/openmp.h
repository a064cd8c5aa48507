// The OpenMP threads under oneDNN (loom's CPU convolutions and matmuls) and TBB's threads
// (everything else) share the cores: first thing in main(), before any thread starts,
//
//   loom::openmp_passive_or_reexec(argc, argv);   // may restart this program once
//
// libgomp's default wait policy keeps its worker threads spinning for a while after each
// parallel region, on cores the TBB kernels that come next need (a 3 to 20x slower step
// measured on two cores: README, "Benchmarks"); OMP_WAIT_POLICY=passive puts them to sleep,
// here after a spin of about 20 microseconds (GOMP_SPINCOUNT=2000, unless set), which catches
// the next oneDNN call where convs come back to back. libgomp reads those variables once, when
// the program loads, so they cannot be set from inside: where OMP_WAIT_POLICY is unset, this
// sets both and executes the program again (/proc/self/exe, the same arguments and
// environment); the new image finds it set and returns at once, as it does wherever the user
// set it (to any value: their choice stands, and GOMP_SPINCOUNT is then left as it is).
// If the restart fails, it warns on stderr and returns, the program running with the
// spinning default. The recipes and benchmarks call it; the test suite sets the variable in
// CTest instead.
#pragma once

namespace loom {

void openmp_passive_or_reexec(int argc, char** argv);

}  // namespace loom
