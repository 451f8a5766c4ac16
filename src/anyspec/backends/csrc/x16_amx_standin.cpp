// The tile products with the plain C++ stand-in for the tile instructions (tiles.h): the same code
// as x16_amx.cpp, which runs on any CPU, so that it is tested bit for bit where AMX is missing.
#define ANYSPEC_AMX_STANDIN 1
#include "x16_amx.h"
