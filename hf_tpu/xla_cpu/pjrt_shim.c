/* hf-tpu's PJRT shim: TorchTPU on XLA's CPU plugin.
 *
 * TorchTPU loads "the TPU runtime" as a PJRT plugin from the library TPU_LIBRARY_PATH names, calling its
 * GetPjrtApi(). This library is that plugin: it loads XLA's CPU PJRT plugin (HF_TPU_XLA_CPU_PLUGIN) and
 * hands TorchTPU a copy of the CPU plugin's function table, with two entries wrapped:
 *
 *   PJRT_Client_Create   TorchTPU always passes `premapped_buffer_size` (a TPU DMA setting), which the CPU
 *                        plugin rejects ("Unexpected option name"): TPU-only options are dropped, and
 *                        `cpu_device_count` = 1 added (TorchTPU uses one device per process anyway).
 *   PJRT_Client_Compile  counted and timed (the number of XLA compilations a program made, TorchTPU's eager
 *                        executables and compiled graphs alike); read with hf_tpu_shim_counters().
 *
 * Only the parts of pjrt_c_api.h used here are declared. For PJRT major version 0 they are stable: fields and
 * functions are only ever appended, and each struct starts with its own size. hf-tpu checks the plugin's
 * version before it points TorchTPU here (hf_tpu/xla_cpu/shim.py); GetPjrtApi checks the layout again and
 * returns NULL with a message on stderr rather than forward a table it does not understand.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct PJRT_Error PJRT_Error;
typedef PJRT_Error *(*pjrt_fn)(void *args);

typedef struct {
  size_t struct_size;
  void *extension_start;
  int major_version;
  int minor_version;
} ApiVersion;

typedef struct {
  size_t struct_size;
  void *extension_start;
  ApiVersion pjrt_api_version;
  pjrt_fn functions[]; /* PJRT_Error_Destroy first; see kClientCreate, kClientCompile */
} Api;

enum { kClientCreate = 10, kClientCompile = 20 }; /* positions in the function table (pjrt_c_api.h order) */
enum { kNamedValueInt64 = 1 };

typedef struct {
  size_t struct_size;
  void *extension_start;
  const char *name;
  size_t name_size;
  int type;
  union {
    const char *string_value;
    int64_t int64_value;
    const int64_t *int64_array_value;
    float float_value;
    _Bool bool_value;
  } value;
  size_t value_size;
} NamedValue;

typedef struct {
  size_t struct_size;
  void *extension_start;
  const NamedValue *create_options;
  size_t num_options;
  /* key-value callbacks and the client (out) follow; passed through untouched */
} ClientCreateArgs;

/* Options TorchTPU sets for a TPU that XLA's CPU plugin does not know. */
static const char *const kTpuOnlyOptions[] = {"premapped_buffer_size"};

static Api *g_api;            /* the table handed to TorchTPU (a copy of the CPU plugin's) */
static pjrt_fn g_create;      /* the CPU plugin's own entries */
static pjrt_fn g_compile;
static char g_error[1024];    /* why GetPjrtApi returned NULL */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint64_t g_compilations;
static uint64_t g_compile_ns;

static int tpu_only(const NamedValue *option) {
  for (size_t i = 0; i < sizeof kTpuOnlyOptions / sizeof *kTpuOnlyOptions; ++i) {
    const char *name = kTpuOnlyOptions[i];
    if (option->name_size == strlen(name) && memcmp(option->name, name, option->name_size) == 0) return 1;
  }
  return 0;
}

static PJRT_Error *client_create(void *raw) {
  ClientCreateArgs *args = raw;
  NamedValue *kept = calloc(args->num_options + 1, sizeof *kept);
  if (kept == NULL) return g_create(raw); /* out of memory: let the plugin report the option */
  size_t n = 0;
  for (size_t i = 0; i < args->num_options; ++i) {
    const NamedValue *option = &args->create_options[i];
    if (!tpu_only(option)) kept[n++] = *option;
  }
  NamedValue *count = &kept[n++];
  count->struct_size = sizeof *count;
  count->name = "cpu_device_count";
  count->name_size = strlen(count->name);
  count->type = kNamedValueInt64;
  count->value.int64_value = 1;
  count->value_size = 1;
  const NamedValue *options = args->create_options;
  size_t num_options = args->num_options;
  args->create_options = kept;
  args->num_options = n;
  PJRT_Error *error = g_create(raw);
  args->create_options = options;
  args->num_options = num_options;
  free(kept);
  return error;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static PJRT_Error *client_compile(void *args) {
  uint64_t start = now_ns();
  PJRT_Error *error = g_compile(args);
  __atomic_add_fetch(&g_compile_ns, now_ns() - start, __ATOMIC_RELAXED);
  __atomic_add_fetch(&g_compilations, 1, __ATOMIC_RELAXED);
  return error;
}

static void set_up(void) {
  const char *path = getenv("HF_TPU_XLA_CPU_PLUGIN");
  if (path == NULL || *path == '\0') {
    snprintf(g_error, sizeof g_error, "HF_TPU_XLA_CPU_PLUGIN is not set (the path of XLA's CPU PJRT plugin)");
    return;
  }
  void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    snprintf(g_error, sizeof g_error, "cannot load XLA's CPU PJRT plugin %s: %s", path, dlerror());
    return;
  }
  const Api *(*get_api)(void) = (const Api *(*)(void))dlsym(library, "GetPjrtApi");
  const Api *api = get_api ? get_api() : NULL;
  if (api == NULL) {
    snprintf(g_error, sizeof g_error, "%s exports no usable GetPjrtApi", path);
    return;
  }
  size_t needed = offsetof(Api, functions) + (kClientCompile + 1) * sizeof(pjrt_fn);
  if (api->pjrt_api_version.major_version != 0 || api->struct_size < needed) {
    snprintf(g_error, sizeof g_error,
             "%s speaks PJRT %d.%d with a %zu-byte function table; this shim knows PJRT 0.x tables of at least "
             "%zu bytes",
             path, api->pjrt_api_version.major_version, api->pjrt_api_version.minor_version, api->struct_size,
             needed);
    return;
  }
  Api *copy = malloc(api->struct_size);
  if (copy == NULL) {
    snprintf(g_error, sizeof g_error, "out of memory");
    return;
  }
  memcpy(copy, api, api->struct_size);
  g_create = api->functions[kClientCreate];
  g_compile = api->functions[kClientCompile];
  copy->functions[kClientCreate] = client_create;
  copy->functions[kClientCompile] = client_compile;
  g_api = copy;
}

__attribute__((visibility("default"))) const void *GetPjrtApi(void) {
  pthread_once(&g_once, set_up);
  if (g_api == NULL) fprintf(stderr, "hf-tpu PJRT shim: %s\n", g_error);
  return g_api;
}

/* Compilations through PJRT_Client_Compile so far, and the nanoseconds they took. */
__attribute__((visibility("default"))) void hf_tpu_shim_counters(uint64_t *compilations, uint64_t *nanoseconds) {
  *compilations = __atomic_load_n(&g_compilations, __ATOMIC_RELAXED);
  *nanoseconds = __atomic_load_n(&g_compile_ns, __ATOMIC_RELAXED);
}
