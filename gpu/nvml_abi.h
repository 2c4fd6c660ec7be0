// The subset of the NVML C ABI that stepwatch uses, declared from NVIDIA's documented API so that
// stepwatch builds without NVIDIA headers. The loader resolves each entry point with dlsym; the
// fake NVML under tests/gpu/fake_nvml implements the same entry points with these types.
// Layouts must match the driver's: only append what NVML itself documents.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stepwatch::gpu::nvml {

using Return = int;  // nvmlReturn_t
constexpr Return kSuccess = 0;
constexpr Return kErrorUninitialized = 1;
constexpr Return kErrorInvalidArgument = 2;
constexpr Return kErrorNotSupported = 3;
constexpr Return kErrorNoPermission = 4;
constexpr Return kErrorNotFound = 6;
constexpr Return kErrorInsufficientSize = 7;
constexpr Return kErrorDriverNotLoaded = 9;
constexpr Return kErrorFunctionNotFound = 13;
constexpr Return kErrorGpuIsLost = 15;
constexpr Return kErrorUnknown = 999;

struct DeviceOpaque;
using Device = DeviceOpaque*;  // nvmlDevice_t
struct GpmSampleOpaque;
using GpmSample = GpmSampleOpaque*;  // nvmlGpmSample_t

// nvmlUtilization_t: percentages of the last sample period.
struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};

// nvmlMemory_t (v1): bytes.
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

// nvmlProcessInfo_v2_t, used by nvmlDeviceGetComputeRunningProcesses_v2 and _v3.
struct ProcessInfoV2 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

// nvmlClockType_t
constexpr unsigned int kClockSm = 1;
// nvmlTemperatureSensors_t
constexpr unsigned int kTemperatureGpu = 0;
// nvmlPcieUtilCounter_t: the value is in KB/s.
constexpr unsigned int kPcieUtilTxBytes = 0;
constexpr unsigned int kPcieUtilRxBytes = 1;

// nvmlValueType_t
constexpr int kValueTypeDouble = 0;
constexpr int kValueTypeUnsignedInt = 1;
constexpr int kValueTypeUnsignedLong = 2;
constexpr int kValueTypeUnsignedLongLong = 3;
constexpr int kValueTypeSignedLongLong = 4;
constexpr int kValueTypeSignedInt = 5;

// nvmlValue_t
union Value {
  double d_val;
  int si_val;
  unsigned int ui_val;
  unsigned long ul_val;
  unsigned long long ull_val;
  signed long long sll_val;
  unsigned short us_val;
};

// nvmlFieldValue_t
struct FieldValue {
  unsigned int field_id;
  unsigned int scope_id;
  long long timestamp;  // CPU time of the reading, microseconds since 1970.
  long long latency_usec;
  int value_type;
  Return nvml_return;
  Value value;
};

// Field ids: cumulative NVLink data traffic of the GPU, KiB.
constexpr unsigned int kFieldNvlinkThroughputDataTx = 138;
constexpr unsigned int kFieldNvlinkThroughputDataRx = 139;

// GPM (Hopper and newer).
constexpr unsigned int kGpmSupportVersion = 1;
struct GpmSupport {
  unsigned int version;
  unsigned int is_supported_device;
};

// nvmlGpmMetricId_t values; all three are percentages 0..100.
constexpr unsigned int kGpmMetricSmUtil = 2;
constexpr unsigned int kGpmMetricAnyTensorUtil = 5;
constexpr unsigned int kGpmMetricDramBwUtil = 10;

struct GpmMetric {
  unsigned int metric_id;
  Return nvml_return;
  double value;
  struct {
    char* short_name;
    char* long_name;
    char* unit;
  } metric_info;
};

constexpr unsigned int kGpmMetricsGetVersion = 1;
// nvmlGpmMetricsGet_t. NVML's own array is NVML_GPM_METRIC_MAX long and grows between driver
// releases; the driver reads and writes only the first num_metrics entries, so a shorter array
// is safe.
constexpr int kGpmMetricsCapacity = 8;
struct GpmMetricsGet {
  unsigned int version;
  unsigned int num_metrics;
  GpmSample sample1;
  GpmSample sample2;
  GpmMetric metrics[kGpmMetricsCapacity];
};

// The driver's layouts on LP64 Linux; a mistake here would corrupt memory, so check at build time.
static_assert(sizeof(Utilization) == 8, "nvmlUtilization_t");
static_assert(sizeof(Memory) == 24, "nvmlMemory_t");
static_assert(sizeof(ProcessInfoV2) == 24, "nvmlProcessInfo_v2_t");
static_assert(sizeof(Value) == 8, "nvmlValue_t");
static_assert(sizeof(FieldValue) == 40 && offsetof(FieldValue, value) == 32, "nvmlFieldValue_t");
static_assert(sizeof(GpmMetric) == 40 && offsetof(GpmMetric, value) == 8, "nvmlGpmMetric_t");
static_assert(offsetof(GpmMetricsGet, metrics) == 24, "nvmlGpmMetricsGet_t");

// Buffer sizes NVML documents for string queries.
constexpr unsigned int kDeviceNameBufferSize = 96;
constexpr unsigned int kDeviceUuidBufferSize = 80;
constexpr unsigned int kDriverVersionBufferSize = 80;

// Entry point signatures.
using InitFn = Return (*)();
using ShutdownFn = Return (*)();
using ErrorStringFn = const char* (*)(Return);
using SystemGetDriverVersionFn = Return (*)(char*, unsigned int);
using DeviceGetCountFn = Return (*)(unsigned int*);
using DeviceGetHandleByIndexFn = Return (*)(unsigned int, Device*);
using DeviceGetStringFn = Return (*)(Device, char*, unsigned int);
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);
using DeviceGetMemoryInfoFn = Return (*)(Device, Memory*);
using DeviceGetClockFn = Return (*)(Device, unsigned int, unsigned int*);
using DeviceGetUintFn = Return (*)(Device, unsigned int*);
using DeviceGetTemperatureFn = Return (*)(Device, unsigned int, unsigned int*);
using DeviceGetUllFn = Return (*)(Device, unsigned long long*);
using DeviceGetPcieThroughputFn = Return (*)(Device, unsigned int, unsigned int*);
using DeviceGetFieldValuesFn = Return (*)(Device, int, FieldValue*);
using DeviceGetProcessesFn = Return (*)(Device, unsigned int*, ProcessInfoV2*);
using GpmQueryDeviceSupportFn = Return (*)(Device, GpmSupport*);
using GpmSampleAllocFn = Return (*)(GpmSample*);
using GpmSampleFreeFn = Return (*)(GpmSample);
using GpmSampleGetFn = Return (*)(Device, GpmSample);
using GpmMetricsGetFn = Return (*)(GpmMetricsGet*);

}  // namespace stepwatch::gpu::nvml
