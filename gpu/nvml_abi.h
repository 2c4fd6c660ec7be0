// The subset of the NVML C ABI that stepwatch uses, declared by stepwatch from NVIDIA's documented
// API (the NVML API reference and the nvml.h shipped with drivers), so that stepwatch builds
// without NVIDIA headers. The loader resolves each entry point with dlsym. The fake NVML under
// tests/gpu/fake_nvml has its own, independent declarations, so that a mistake here is not mirrored
// there and shows up in the tests.
//
// Every struct has static assertions of its size and field offsets on LP64 Linux (x86_64, aarch64)
// with the header version the values come from. "R520" means the nvml.h of the 520 driver branch,
// "NVML 13" the newest header (API version 13). A first version marked "?" is where the project
// believes the declaration appeared, not re-checked; the layouts and values themselves are the
// ones NVIDIA's NVML API reference documents for the newest header.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>

namespace stepwatch::gpu::nvml {

// nvmlReturn_t (an enum, 4 bytes); values unchanged from R450? to NVML 13.
using Return = int;
constexpr Return kSuccess = 0;
constexpr Return kErrorUninitialized = 1;
constexpr Return kErrorInvalidArgument = 2;
constexpr Return kErrorNotSupported = 3;
constexpr Return kErrorNoPermission = 4;
constexpr Return kErrorNotFound = 6;
constexpr Return kErrorInsufficientSize = 7;
constexpr Return kErrorDriverNotLoaded = 9;
constexpr Return kErrorTimeout = 10;
constexpr Return kErrorFunctionNotFound = 13;
constexpr Return kErrorGpuIsLost = 15;
constexpr Return kErrorUnknown = 999;

struct DeviceOpaque;
using Device = DeviceOpaque*;  // nvmlDevice_t
struct GpmSampleOpaque;
using GpmSample = GpmSampleOpaque*;  // nvmlGpmSample_t

// nvmlUtilization_t (every header since R270?): percentages of the last sample period.
struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};
static_assert(sizeof(Utilization) == 8 && offsetof(Utilization, memory) == 4, "nvmlUtilization_t");

// nvmlMemory_t (v1, every header): bytes.
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(Memory) == 24 && offsetof(Memory, free) == 8 && offsetof(Memory, used) == 16,
              "nvmlMemory_t");

// Process lists. Three entry layouts exist; the entry point and the driver decide which one the
// driver writes, and a buffer read with the wrong stride gives wrong pids (and, when the driver's
// entries are the larger ones, lets it write past the buffer). gpu/process_list.h picks the stride.
//
// nvmlProcessInfo_v1_t: nvmlDeviceGetComputeRunningProcesses (unversioned) in R450? and later
// headers.
struct ProcessInfoV1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};
static_assert(sizeof(ProcessInfoV1) == 16 && offsetof(ProcessInfoV1, used_gpu_memory) == 8,
              "nvmlProcessInfo_v1_t (R450?..NVML 13)");

// nvmlProcessInfo_v2_t: nvmlDeviceGetComputeRunningProcesses_v2 (R460? and later) and _v3 (R510 to
// 535.43 exclusive, and 535.104 and later, where nvmlProcessInfo_t is again this layout).
struct ProcessInfoV2 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
static_assert(sizeof(ProcessInfoV2) == 24 && offsetof(ProcessInfoV2, used_gpu_memory) == 8 &&
                  offsetof(ProcessInfoV2, gpu_instance_id) == 16 &&
                  offsetof(ProcessInfoV2, compute_instance_id) == 20,
              "nvmlProcessInfo_v2_t (R460?..NVML 13)");

// The nvmlProcessInfo_t that nvmlDeviceGetComputeRunningProcesses_v3 writes in drivers 535.43.02
// to 535.86.x (an added usedGpuCcProtectedMemory); 535.98 drops _v3, 535.104 restores 24 bytes.
struct ProcessInfoV3Cc {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
  unsigned long long used_gpu_cc_protected_memory;
};
static_assert(sizeof(ProcessInfoV3Cc) == 32 && offsetof(ProcessInfoV3Cc, used_gpu_memory) == 8 &&
                  offsetof(ProcessInfoV3Cc, gpu_instance_id) == 16 &&
                  offsetof(ProcessInfoV3Cc, compute_instance_id) == 20 &&
                  offsetof(ProcessInfoV3Cc, used_gpu_cc_protected_memory) == 24,
              "nvmlProcessInfo_t of 535.43.02..535.86");

// nvmlClockType_t
constexpr unsigned int kClockSm = 1;
// nvmlTemperatureSensors_t
constexpr unsigned int kTemperatureGpu = 0;
// nvmlPcieUtilCounter_t: the value is in KB/s.
constexpr unsigned int kPcieUtilTxBytes = 0;
constexpr unsigned int kPcieUtilRxBytes = 1;

// nvmlTemperature_t (v1; R550? and later): for nvmlDeviceGetTemperatureV, which
// replaces the deprecated nvmlDeviceGetTemperature in NVML 13.
struct Temperature {
  unsigned int version;
  int sensor_type;  // nvmlTemperatureSensors_t (an enum, 4 bytes)
  int temperature;  // degrees C
};
static_assert(sizeof(Temperature) == 12 && offsetof(Temperature, sensor_type) == 4 &&
                  offsetof(Temperature, temperature) == 8,
              "nvmlTemperature_v1_t (R550?..NVML 13)");
// NVML_STRUCT_VERSION(Temperature, 1): the struct size in the low bits, the version from bit 24.
constexpr unsigned int kTemperatureVersion1 = sizeof(Temperature) | (1u << 24);

// nvmlValueType_t (R410?..NVML 13).
constexpr int kValueTypeDouble = 0;
constexpr int kValueTypeUnsignedInt = 1;
constexpr int kValueTypeUnsignedLong = 2;
constexpr int kValueTypeUnsignedLongLong = 3;
constexpr int kValueTypeSignedLongLong = 4;
constexpr int kValueTypeSignedInt = 5;
constexpr int kValueTypeUnsignedShort = 6;  // R535? and later

// nvmlValue_t: 8 bytes whatever the member; the value type says which member is valid.
union Value {
  double d_val;
  unsigned int ui_val;
  unsigned long ul_val;
  unsigned long long ull_val;
  signed long long sll_val;
  int si_val;
  unsigned short us_val;
};
static_assert(sizeof(Value) == 8, "nvmlValue_t (R410?..NVML 13)");

// nvmlFieldValue_t (R410?..NVML 13).
struct FieldValue {
  unsigned int field_id;
  // For per-link fields: the NVLink number, or kScopeAllLinks for the sum over links.
  unsigned int scope_id;
  long long timestamp;  // CPU time of the reading, microseconds since 1970.
  long long latency_usec;
  int value_type;  // nvmlValueType_t
  Return nvml_return;
  Value value;
};
static_assert(sizeof(FieldValue) == 40 && offsetof(FieldValue, scope_id) == 4 &&
                  offsetof(FieldValue, timestamp) == 8 &&
                  offsetof(FieldValue, latency_usec) == 16 &&
                  offsetof(FieldValue, value_type) == 24 &&
                  offsetof(FieldValue, nvml_return) == 28 && offsetof(FieldValue, value) == 32,
              "nvmlFieldValue_t (R410?..NVML 13)");

// Field ids (R470?..NVML 13): cumulative NVLink data traffic, KiB. scopeId selects one link;
// UINT_MAX asks for the sum over all links (a scopeId left at 0 would read link 0 alone).
constexpr unsigned int kFieldNvlinkThroughputDataTx = 138;
constexpr unsigned int kFieldNvlinkThroughputDataRx = 139;
constexpr unsigned int kScopeAllLinks = UINT_MAX;

// nvmlDeviceGetMigMode values (R450?..NVML 13).
constexpr unsigned int kDeviceMigDisable = 0;
constexpr unsigned int kDeviceMigEnable = 1;

// GPM (Hopper and newer; entry points from R520).
// nvmlGpmSupport_t
constexpr unsigned int kGpmSupportVersion = 1;
struct GpmSupport {
  unsigned int version;
  unsigned int is_supported_device;
};
static_assert(sizeof(GpmSupport) == 8 && offsetof(GpmSupport, is_supported_device) == 4,
              "nvmlGpmSupport_t (R520..NVML 13)");

// nvmlGpmMetricId_t values (R520..NVML 13); all three are percentages 0..100.
constexpr unsigned int kGpmMetricSmUtil = 2;
constexpr unsigned int kGpmMetricAnyTensorUtil = 5;
constexpr unsigned int kGpmMetricDramBwUtil = 10;

// nvmlGpmMetric_t (R520..NVML 13).
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
static_assert(sizeof(GpmMetric) == 40 && offsetof(GpmMetric, nvml_return) == 4 &&
                  offsetof(GpmMetric, value) == 8 && offsetof(GpmMetric, metric_info) == 16,
              "nvmlGpmMetric_t (R520..NVML 13)");

// nvmlGpmMetricsGet_t. Its array is NVML_GPM_METRIC_MAX long, which grew between releases: 98 in
// the R520..R525 headers, 210 later, 333 in the newest. A driver may use its own
// NVML_GPM_METRIC_MAX for the whole struct, so the array has the largest size any driver uses.
constexpr unsigned int kGpmMetricsGetVersion = 1;
constexpr int kGpmMetricMax = 333;
struct GpmMetricsGet {
  unsigned int version;
  unsigned int num_metrics;
  GpmSample sample1;
  GpmSample sample2;
  GpmMetric metrics[kGpmMetricMax];
};
static_assert(offsetof(GpmMetricsGet, num_metrics) == 4 && offsetof(GpmMetricsGet, sample1) == 8 &&
                  offsetof(GpmMetricsGet, sample2) == 16 &&
                  offsetof(GpmMetricsGet, metrics) == 24 && sizeof(GpmMetricsGet) == 24 + 40 * 333,
              "nvmlGpmMetricsGet_t with NVML_GPM_METRIC_MAX = 333 (newest headers)");

// Buffer sizes NVML documents for string queries (R510?..NVML 13).
constexpr unsigned int kDeviceNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned int kDeviceUuidBufferSize = 96;     // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned int kDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
constexpr unsigned int kNvmlVersionBufferSize = 80;    // NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE

// Health readings (gpu/gpu_health.cc).
// nvmlMemoryErrorType_t and nvmlEccCounterType_t (R270?..NVML 13).
constexpr unsigned int kMemoryErrorTypeCorrected = 0;
constexpr unsigned int kMemoryErrorTypeUncorrected = 1;
constexpr unsigned int kVolatileEcc = 0;
constexpr unsigned int kAggregateEcc = 1;
// nvmlEnableState_t
constexpr unsigned int kFeatureDisabled = 0;
constexpr unsigned int kFeatureEnabled = 1;
// NVML_NVLINK_MAX_LINKS (18 since R450?; 12 and 6 in older headers).
constexpr unsigned int kNvlinkMaxLinks = 18;
// nvmlNvLinkErrorCounter_t (R384?..NVML 13).
constexpr unsigned int kNvlinkErrorDlReplay = 0;
constexpr unsigned int kNvlinkErrorDlRecovery = 1;
constexpr unsigned int kNvlinkErrorDlCrcFlit = 2;
constexpr unsigned int kNvlinkErrorDlCrcData = 3;
// nvmlEventType* bit (R270?..NVML 13).
constexpr unsigned long long kEventTypeXidCriticalError = 0x0000000000000008ULL;

struct EventSetOpaque;
using EventSet = EventSetOpaque*;  // nvmlEventSet_t

// nvmlEventData_t as nvmlEventSetWait_v2 writes it (R450?..NVML 13; the instance ids were added
// with MIG, the unversioned nvmlEventSetWait wrote only the first 24 bytes).
struct EventData {
  Device device;
  unsigned long long event_type;
  unsigned long long event_data;  // the Xid code for kEventTypeXidCriticalError
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
static_assert(sizeof(EventData) == 32 && offsetof(EventData, event_type) == 8 &&
                  offsetof(EventData, event_data) == 16 &&
                  offsetof(EventData, gpu_instance_id) == 24 &&
                  offsetof(EventData, compute_instance_id) == 28,
              "nvmlEventData_t (R450?..NVML 13)");

// Entry point signatures.
using InitFn = Return (*)();
using ShutdownFn = Return (*)();
using ErrorStringFn = const char* (*)(Return);
using SystemGetStringFn = Return (*)(char*, unsigned int);
using DeviceGetCountFn = Return (*)(unsigned int*);
using DeviceGetHandleByIndexFn = Return (*)(unsigned int, Device*);
using DeviceGetStringFn = Return (*)(Device, char*, unsigned int);
using DeviceGetUtilizationRatesFn = Return (*)(Device, Utilization*);
using DeviceGetMemoryInfoFn = Return (*)(Device, Memory*);
using DeviceGetClockFn = Return (*)(Device, unsigned int, unsigned int*);
using DeviceGetUintFn = Return (*)(Device, unsigned int*);
using DeviceGetTemperatureFn = Return (*)(Device, unsigned int, unsigned int*);
using DeviceGetTemperatureVFn = Return (*)(Device, Temperature*);
using DeviceGetUllFn = Return (*)(Device, unsigned long long*);
using DeviceGetPcieThroughputFn = Return (*)(Device, unsigned int, unsigned int*);
using DeviceGetFieldValuesFn = Return (*)(Device, int, FieldValue*);
// The info pointer's type depends on the entry point and driver (see ProcessInfo*): void*.
using DeviceGetProcessesFn = Return (*)(Device, unsigned int*, void*);
using DeviceGetMigModeFn = Return (*)(Device, unsigned int*, unsigned int*);
using GpmQueryDeviceSupportFn = Return (*)(Device, GpmSupport*);
using GpmSampleAllocFn = Return (*)(GpmSample*);
using GpmSampleFreeFn = Return (*)(GpmSample);
using GpmSampleGetFn = Return (*)(Device, GpmSample);
using GpmMetricsGetFn = Return (*)(GpmMetricsGet*);
// nvmlDeviceGetTotalEccErrors(device, nvmlMemoryErrorType_t, nvmlEccCounterType_t, counts).
using DeviceGetTotalEccErrorsFn = Return (*)(Device, unsigned int, unsigned int,
                                             unsigned long long*);
// nvmlDeviceGetRemappedRows(device, corrRows, uncRows, isPending, failureOccurred).
using DeviceGetRemappedRowsFn = Return (*)(Device, unsigned int*, unsigned int*, unsigned int*,
                                           unsigned int*);
// nvmlDeviceGetNvLinkState(device, link, nvmlEnableState_t* isActive).
using DeviceGetNvLinkStateFn = Return (*)(Device, unsigned int, unsigned int*);
// nvmlDeviceGetNvLinkErrorCounter(device, link, nvmlNvLinkErrorCounter_t, counterValue).
using DeviceGetNvLinkErrorCounterFn = Return (*)(Device, unsigned int, unsigned int,
                                                 unsigned long long*);
using EventSetCreateFn = Return (*)(EventSet*);
using EventSetFreeFn = Return (*)(EventSet);
using DeviceRegisterEventsFn = Return (*)(Device, unsigned long long, EventSet);
// nvmlEventSetWait_v2(set, data, timeoutms): NVML_ERROR_TIMEOUT when no event came in time.
using EventSetWaitFn = Return (*)(EventSet, EventData*, unsigned int);

}  // namespace stepwatch::gpu::nvml
