/* A QEMU TCG plugin that counts the guest instructions a process executes, for
 * `cargo xtask aarch64 --count`. Each translated block adds its instruction count to one
 * 64-bit counter when it starts (an inline add, no call per block); at exit the total is
 * written to the file named by the plugin argument `out=PATH` (stderr without one).
 *
 * The counter is one plain variable: exact for a guest that runs one thread at a time
 * (the counts are taken with one compute thread); guest threads running at once could
 * lose increments. Written for the plugin API of QEMU 7.2 (QEMU_PLUGIN_VERSION 1), whose
 * header the xtask downloads from the installed qemu-user's Debian source.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

static uint64_t executed;
static char out_path[4096];

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &executed,
                                             qemu_plugin_tb_n_insns(tb));
}

static void on_exit(qemu_plugin_id_t id, void *data)
{
    (void)id;
    (void)data;
    FILE *f = out_path[0] ? fopen(out_path, "w") : NULL;
    fprintf(f ? f : stderr, "instructions %" PRIu64 "\n", executed);
    if (f) {
        fclose(f);
    }
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0 && strlen(argv[i] + 4) < sizeof out_path) {
            strcpy(out_path, argv[i] + 4);
        } else {
            fprintf(stderr, "insn_count: unknown argument '%s' (expected out=PATH)\n", argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, on_exit, NULL);
    return 0;
}
