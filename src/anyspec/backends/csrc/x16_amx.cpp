// The tile products on the CPU's AMX tiles (the code: x16_amx.h), and whether this process may
// use them. Built on 64-bit x86 Linux with GCC 11 or later, whose headers have the tile
// intrinsics; elsewhere amx_hw_usable() is false and level 3 exists only with the stand-in.
#include "x16.h"

#if ANYSPEC_AMX_HW
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#include "tiles.h"

// Every header is included above: an inline function first seen under the pragma would be compiled
// for AVX-512, and the linker may keep that copy for the other files too.
// As -mamx-tile -mamx-int8 for this code only; every CPU with AMX has AVX-512, which the loops
// around the tiles may use.
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq")
#include "x16_amx.h"
#pragma GCC pop_options

namespace anyspec {

namespace {

constexpr long ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;

bool amx_allowed() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25)))
    return false;  // amx_tile, amx_int8
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE, for xgetbv
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // the OS saves tile config and data
  // Linux (5.16 on) gives tile data only to a process that asks for it; the grant is process-wide,
  // so every OpenMP thread, started before or after, may then use the tiles.
  if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return false;
  unsigned long granted = 0;
  return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) == 0 && (granted >> XFEATURE_XTILEDATA & 1);
}

}  // namespace

bool amx_hw_usable() {
  static const bool ok = cpu_isa() == 2 && amx_allowed();
  return ok;
}

}  // namespace anyspec

#else

namespace anyspec {
bool amx_hw_usable() { return false; }
}  // namespace anyspec

#endif
