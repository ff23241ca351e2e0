/*
 * spank_pyxis_standin_no_container: a TEST STAND-IN for NVIDIA pyxis. IT RUNS NO CONTAINER.
 *
 * The test cluster has no pyxis/enroot (no Debian or PyPI package provides them), and a Slurm without
 * pyxis rejects `srun --container-image=...` with "unrecognized option". This plugin registers pyxis
 * 0.24's option names so the exact srun lines users get are accepted, and exports each value given to
 * the task environment as PYXIS_STANDIN_<OPTION>=<value> so tests can check what pyxis would have got.
 * A pair of opposite flags (--container-mount-home / --no-container-mount-home,
 * --container-writable / --container-readonly, ...) sets one variable to 1 or 0; the last flag wins.
 * The task itself runs directly on the host, exactly as without the option.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(pyxis_standin_no_container, 1);

struct standin_option {
    const char *name;     /* pyxis's long option name */
    const char *env;      /* task variable the value is exported to */
    const char *arginfo;  /* NULL for a flag */
    const char *flag_value;
};

static const struct standin_option options[] = {
    {"container-image", "PYXIS_STANDIN_CONTAINER_IMAGE", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH", NULL},
    {"container-mounts", "PYXIS_STANDIN_CONTAINER_MOUNTS", "SRC[:DST[:FLAGS]][,...]", NULL},
    {"container-workdir", "PYXIS_STANDIN_CONTAINER_WORKDIR", "PATH", NULL},
    {"container-name", "PYXIS_STANDIN_CONTAINER_NAME", "NAME[:FLAG]", NULL},
    {"container-save", "PYXIS_STANDIN_CONTAINER_SAVE", "PATH", NULL},
    {"container-env", "PYXIS_STANDIN_CONTAINER_ENV", "NAME[,NAME...]", NULL},
    {"container-unshare", "PYXIS_STANDIN_CONTAINER_UNSHARE", "NAMESPACE[,...]", NULL},
    {"container-mount-home", "PYXIS_STANDIN_CONTAINER_MOUNT_HOME", NULL, "1"},
    {"no-container-mount-home", "PYXIS_STANDIN_CONTAINER_MOUNT_HOME", NULL, "0"},
    {"container-remap-root", "PYXIS_STANDIN_CONTAINER_REMAP_ROOT", NULL, "1"},
    {"no-container-remap-root", "PYXIS_STANDIN_CONTAINER_REMAP_ROOT", NULL, "0"},
    {"container-entrypoint", "PYXIS_STANDIN_CONTAINER_ENTRYPOINT", NULL, "1"},
    {"no-container-entrypoint", "PYXIS_STANDIN_CONTAINER_ENTRYPOINT", NULL, "0"},
    {"container-entrypoint-log", "PYXIS_STANDIN_CONTAINER_ENTRYPOINT_LOG", NULL, "1"},
    {"container-writable", "PYXIS_STANDIN_CONTAINER_WRITABLE", NULL, "1"},
    {"container-readonly", "PYXIS_STANDIN_CONTAINER_WRITABLE", NULL, "0"},
};

#define OPTION_COUNT (sizeof(options) / sizeof(options[0]))

/* Values seen, stored at the index of the first option that shares their variable. */
static char *values[OPTION_COUNT];
static struct spank_option registered[OPTION_COUNT];

static size_t slot_of(size_t index)
{
    size_t slot = 0;
    while (strcmp(options[slot].env, options[index].env) != 0)
        slot++;
    return slot;
}

static int on_option(int val, const char *optarg, int remote)
{
    (void)remote;
    if (val < 0 || (size_t)val >= OPTION_COUNT)
        return ESPANK_BAD_ARG;
    const char *value = options[val].arginfo ? optarg : options[val].flag_value;
    size_t slot = slot_of((size_t)val);
    free(values[slot]);
    values[slot] = strdup(value ? value : "");
    return values[slot] ? ESPANK_SUCCESS : ESPANK_ERROR;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    spank_context_t ctx = spank_context();
    /* Options exist only where users type them (srun, sbatch/salloc) and where they arrive (slurmstepd). */
    if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR)
        return ESPANK_SUCCESS;
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        registered[i] = (struct spank_option){
            .name = (char *)options[i].name,
            .arginfo = (char *)options[i].arginfo,
            .usage = "pyxis option, accepted by a TEST STAND-IN that runs NO container",
            .has_arg = options[i].arginfo ? 1 : 0,
            .val = (int)i,
            .cb = on_option,
        };
        spank_err_t rc = spank_option_register(sp, &registered[i]);
        if (rc != ESPANK_SUCCESS) {
            slurm_error("pyxis_standin_no_container: cannot register --%s: %s", options[i].name,
                        spank_strerror(rc));
            return rc;
        }
    }
    return ESPANK_SUCCESS;
}

static int any_value(void)
{
    for (size_t i = 0; i < OPTION_COUNT; i++)
        if (values[i])
            return 1;
    return 0;
}

/* srun side: one plain line on the user's stderr whenever a container option was used. */
int slurm_spank_local_user_init(spank_t sp, int ac, char **av)
{
    (void)sp;
    (void)ac;
    (void)av;
    if (any_value())
        slurm_info("pyxis_standin_no_container: test stand-in for pyxis, NO container is run; "
                   "--container-* values are only exported as PYXIS_STANDIN_* variables");
    return ESPANK_SUCCESS;
}

/* slurmstepd side, before the tasks start: what is set here is inherited by every task. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (!any_value())
        return ESPANK_SUCCESS;
    slurm_info("pyxis_standin_no_container: NO container is run for this step");
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        if (!values[i])
            continue;
        spank_err_t rc = spank_setenv(sp, options[i].env, values[i], 1);
        if (rc != ESPANK_SUCCESS) {
            slurm_error("pyxis_standin_no_container: cannot set %s: %s", options[i].env, spank_strerror(rc));
            return rc;
        }
    }
    return ESPANK_SUCCESS;
}
