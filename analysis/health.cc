#include "analysis/health.h"

namespace stepwatch::analysis {

XidClass ClassifyXid(uint32_t xid) {
  // After NVIDIA's published Xid catalogue: which codes point at the GPU, its memory, its links
  // or its firmware, and which at the program that ran on it (a bad kernel faults the same way on
  // any GPU, so draining the node would not help).
  switch (xid) {
    case 13:
      return {"graphics engine exception", false, false};
    case 31:
      return {"GPU memory page fault", false, false};
    case 32:
      return {"invalid or corrupted push buffer stream", false, false};
    case 38:
      return {"driver firmware error", true, false};
    case 43:
      return {"GPU stopped processing", false, false};
    case 45:
      return {"preemptive cleanup after an earlier error", false, false};
    case 48:
      return {"double-bit ECC error", true, true};
    case 61:
      return {"internal micro-controller breakpoint", true, false};
    case 62:
      return {"internal micro-controller halt", true, true};
    case 63:
      return {"ECC page retirement or row remapping recorded", true, false};
    case 64:
      return {"ECC page retirement or row remapping failed", true, true};
    case 68:
      return {"video decoder exception", true, false};
    case 69:
      return {"graphics engine class error", false, false};
    case 74:
      return {"NVLink error", true, true};
    case 79:
      return {"GPU has fallen off the bus", true, true};
    case 92:
      return {"high single-bit ECC error rate", true, false};
    case 94:
      return {"contained ECC error", true, false};
    case 95:
      return {"uncontained ECC error", true, true};
    case 109:
      return {"context switch timeout", false, false};
    case 119:
      return {"GSP firmware RPC timeout", true, true};
    case 120:
      return {"GSP firmware error", true, true};
    case 121:
      return {"C2C link error", true, true};
    case 140:
      return {"unrecovered ECC error", true, true};
    default:
      // An unknown code is reported, as a warning: the catalogue grows with every driver.
      return {"Xid error", true, false};
  }
}

}  // namespace stepwatch::analysis
