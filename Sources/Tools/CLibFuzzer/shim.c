// An empty translation unit: SwiftPM wants a source file for every C target.
#include "CLibFuzzer.h"
