/*
 * libnvidia-ml.so.1 for a simulated node: the NVML calls NVIDIA's container toolkit makes
 * (`nvidia-ctk cdi generate`, through go-nvml and go-nvlib), and the few a probe or a fake
 * `nvidia-smi -L` makes, answered for the GPUs of one simulated topology.
 *
 * Why C and why no libc: nvidia-ctk dlopens the library by its soname, so it must be a real
 * ELF shared object; built with -nostdlib it has no DT_NEEDED entry at all, so a statically
 * linked probe can also dlopen it inside a container that has no libc (busybox images).
 *
 * The GPUs are compiled in: shim_devices.h (written by topo_testkit/driver_root.py from our
 * `discover --format json`) defines SHIM_DRIVER_VERSION, SHIM_CUDA_VERSION, SHIM_GPUS and
 * SHIM_DEV_ROOT (the simulated driver root's /dev). As the real driver only lets a process
 * open the GPUs whose device node it has, a GPU is listed only where /dev/nvidia<minor> or
 * SHIM_DEV_ROOT/nvidia<minor> exists: on the host (nvidia-ctk with --dev-root) every GPU, in a
 * container exactly the GPUs whose nodes its CDI devices injected, renumbered from 0 as NVML
 * numbers them. The check is a raw access(2) system call (x86_64), since there is no libc.
 * Every other NVML function is absent, as on an older driver: go-nvlib checks for the MIG
 * calls by symbol, and a call to a missing one fails loudly (symbol lookup error), which is
 * how a new call the toolkit makes shows up in the tests.
 */
#include "shim_devices.h"

typedef int nvmlReturn_t;
enum {
  NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_NOT_FOUND = 6,
};

struct shim_gpu {
  const char *uuid;
  const char *name;
  unsigned int minor;
  unsigned int domain, bus, device, function;
  unsigned long long memory;
};

typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
                 char busId[32]; } nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef const struct shim_gpu *nvmlDevice_t;

static const struct shim_gpu gpus[] = { SHIM_GPUS };
#define ALL_GPUS (sizeof(gpus) / sizeof(gpus[0]))
/* The GPUs this process can see (module comment), in NVML index order; set by nvmlInit. */
static const struct shim_gpu *visible[ALL_GPUS];
static unsigned int gpu_count;
static int initialized;

/* gcc may emit calls to these for struct copies even without libc. */
__attribute__((visibility("hidden"))) void *memset(void *s, int c, unsigned long n) {
  unsigned char *p = s; while (n--) *p++ = (unsigned char)c; return s;
}
__attribute__((visibility("hidden"))) void *memcpy(void *d, const void *s, unsigned long n) {
  unsigned char *o = d; const unsigned char *i = s; while (n--) *o++ = *i++; return d;
}

static unsigned long slen(const char *s) { unsigned long n = 0; while (s[n]) n++; return n; }
static int seq(const char *a, const char *b) { while (*a && *a == *b) { a++; b++; } return *a == *b; }
static nvmlReturn_t scopy(char *out, unsigned int size, const char *s) {
  unsigned long n = slen(s), i;
  if (!out) return NVML_ERROR_INVALID_ARGUMENT;
  if (n + 1 > size) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (i = 0; i <= n; i++) out[i] = s[i];
  return NVML_SUCCESS;
}
static char hex(unsigned int v) { v &= 15; return (char)(v < 10 ? '0' + v : 'A' + v - 10); }
/* "%0*X" into p, width digits; returns the end. */
static char *puthex(char *p, unsigned int v, int width) {
  int i; for (i = width - 1; i >= 0; i--) p[i] = hex(v >> (4 * (width - 1 - i))); return p + width;
}
static long sys_access(const char *path) {
  long r;
  __asm__ volatile ("syscall" : "=a"(r) : "a"(21L), "D"(path), "S"(0L) : "rcx", "r11", "memory");
  return r;
}
/* "<prefix>/nvidia<minor>" into out (256 bytes); 0 when it exists. */
static int node_exists(const char *prefix, unsigned int minor) {
  char out[256], digits[12];
  unsigned long n = 0, i;
  int k = 0;
  const char *name = "/nvidia";
  if (slen(prefix) + 24 > sizeof out) return 0;
  for (i = 0; prefix[i]; i++) out[n++] = prefix[i];
  for (i = 0; name[i]; i++) out[n++] = name[i];
  do { digits[k++] = (char)('0' + minor % 10); minor /= 10; } while (minor);
  while (k) out[n++] = digits[--k];
  out[n] = 0;
  return sys_access(out) == 0;
}
static void find_visible(void) {
  unsigned int i;
  gpu_count = 0;
  for (i = 0; i < ALL_GPUS; i++)
    if (node_exists("/dev", gpus[i].minor) || node_exists(SHIM_DEV_ROOT, gpus[i].minor)) visible[gpu_count++] = &gpus[i];
}
static int valid(nvmlDevice_t d) {
  unsigned int i;
  for (i = 0; i < gpu_count; i++) if (visible[i] == d) return 1;
  return 0;
}
#define CHECK(d) do { if (!initialized) return NVML_ERROR_UNINITIALIZED; \
                      if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

nvmlReturn_t nvmlInit_v2(void) {
  if (!initialized) find_visible();
  initialized++;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  initialized--; return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
  return scopy(version, length, SHIM_DRIVER_VERSION);
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
  return scopy(version, length, SHIM_NVML_VERSION);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
  if (!v) return NVML_ERROR_INVALID_ARGUMENT;
  *v = SHIM_CUDA_VERSION; return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  *count = gpu_count; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (!d || i >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
  *d = visible[i]; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) {
  unsigned int i;
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (!uuid || !d) return NVML_ERROR_INVALID_ARGUMENT;
  for (i = 0; i < gpu_count; i++) if (seq(visible[i]->uuid, uuid)) { *d = visible[i]; return NVML_SUCCESS; }
  return NVML_ERROR_NOT_FOUND;
}

static void bus_id(nvmlDevice_t d, char *out, int domain_width) {
  char *p = puthex(out, d->domain, domain_width);
  *p++ = ':'; p = puthex(p, d->bus, 2); *p++ = ':'; p = puthex(p, d->device, 2);
  *p++ = '.'; p = puthex(p, d->function, 1); *p = 0;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
  CHECK(d);
  if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
  memset(pci, 0, sizeof(*pci));
  pci->domain = d->domain; pci->bus = d->bus; pci->device = d->device;
  pci->pciDeviceId = 0x233010de; pci->pciSubSystemId = 0x16c110de;
  bus_id(d, pci->busIdLegacy, 4);
  bus_id(d, pci->busId, 8);  /* NVML's busId has an 8-digit domain: 00000000:18:00.0 */
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(d, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(d, pci); }

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
  CHECK(d); return scopy(uuid, length, d->uuid);
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
  CHECK(d); return scopy(name, length, d->name);
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
  unsigned int i;
  CHECK(d);
  if (!index) return NVML_ERROR_INVALID_ARGUMENT;
  for (i = 0; i < gpu_count; i++) if (visible[i] == d) { *index = i; break; }
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
  CHECK(d);
  if (!minor) return NVML_ERROR_INVALID_ARGUMENT;
  *minor = d->minor; return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  CHECK(d);
  if (!m) return NVML_ERROR_INVALID_ARGUMENT;
  m->total = d->memory; m->free = d->memory; m->used = 0; return NVML_SUCCESS;
}
/* No GPU of a simulated node is in MIG mode here: go-nvlib then lists whole GPUs only. */
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
  CHECK(d); (void)current; (void)pending; return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
  CHECK(d);
  if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
  *is_mig = 0; return NVML_SUCCESS;
}
