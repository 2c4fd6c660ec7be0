// Resolving NVML entry points from a library loaded with dlopen.
#pragma once

#include <dlfcn.h>

#include <initializer_list>

namespace stepwatch::gpu {

// Sets *out to the first of `names` that the library exports (list the newest version first),
// or to nullptr when it exports none of them.
template <typename Fn>
void ResolveNvmlSymbol(void* handle, Fn* out, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (void* sym = dlsym(handle, name)) {
      *out = reinterpret_cast<Fn>(sym);
      return;
    }
  }
  *out = nullptr;
}

}  // namespace stepwatch::gpu
