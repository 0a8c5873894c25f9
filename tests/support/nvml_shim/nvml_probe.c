/*
 * A container-side check that the driver's NVML library is really there: dlopen
 * libnvidia-ml.so.1 (the soname, as CUDA and nvidia-smi load it), nvmlInit_v2,
 * nvmlDeviceGetCount_v2, and each GPU's UUID. Linked statically, so it runs in an image with no
 * libc; the library it loads is whatever the container's mounts (the toolkit's CDI spec) put
 * on the loader's path.
 *
 *   nvml-probe            "nvml: 2 GPUs, driver 570.86.15" then one line per GPU, exit 0
 *   nvidia-smi -L         (installed under that name: the fake nvidia-smi of a simulated
 *                          driver root) "GPU 0: NAME (UUID: GPU-...)" per GPU, as nvidia-smi -L
 * Exit 2: the library could not be loaded (dlerror printed); 3: an NVML call failed.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_fn)(void);
typedef int (*count_fn)(unsigned int *);
typedef int (*handle_fn)(unsigned int, void **);
typedef int (*str_fn)(void *, char *, unsigned int);
typedef int (*version_fn)(char *, unsigned int);

static void *need(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (!f) { fprintf(stderr, "nvml-probe: %s: %s\n", name, dlerror()); }
  return f;
}

int main(int argc, char **argv) {
  const char *base = strrchr(argv[0], '/');
  int as_smi = strcmp(base ? base + 1 : argv[0], "nvidia-smi") == 0;
  const char *path = getenv("NVML_PROBE_LIBRARY");  /* tests: a file by path; default the soname */
  (void)argc;
  if (!path || !*path) path = "libnvidia-ml.so.1";
  void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) { fprintf(stderr, "nvml-probe: cannot load %s: %s\n", path, dlerror()); return 2; }
  init_fn init = (init_fn)need(lib, "nvmlInit_v2");
  count_fn count = (count_fn)need(lib, "nvmlDeviceGetCount_v2");
  handle_fn handle = (handle_fn)need(lib, "nvmlDeviceGetHandleByIndex_v2");
  str_fn uuid = (str_fn)need(lib, "nvmlDeviceGetUUID");
  str_fn name = (str_fn)need(lib, "nvmlDeviceGetName");
  version_fn driver = (version_fn)need(lib, "nvmlSystemGetDriverVersion");
  if (!init || !count || !handle || !uuid || !name || !driver) return 3;
  int r = init();
  if (r) { fprintf(stderr, "nvml-probe: nvmlInit_v2 returned %d\n", r); return 3; }
  unsigned int n = 0;
  char version[96] = "";
  if ((r = count(&n)) || (r = driver(version, sizeof version))) {
    fprintf(stderr, "nvml-probe: NVML call returned %d\n", r); return 3;
  }
  if (!as_smi) printf("nvml: %u GPUs, driver %s\n", n, version);
  for (unsigned int i = 0; i < n; i++) {
    void *d = 0;
    char u[96] = "", m[96] = "";
    if ((r = handle(i, &d)) || (r = uuid(d, u, sizeof u)) || (r = name(d, m, sizeof m))) {
      fprintf(stderr, "nvml-probe: GPU %u: NVML call returned %d\n", i, r); return 3;
    }
    printf("GPU %u: %s (UUID: %s)\n", i, m, u);
  }
  return 0;
}
