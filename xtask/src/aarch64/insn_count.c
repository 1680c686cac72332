/* A QEMU TCG plugin that counts the guest instructions a process executes, for
 * `cargo xtask aarch64 --count`. Each translated block adds its instruction count to one
 * 64-bit counter when it starts (an inline add, no call per block); at exit the total is
 * written to the file named by the plugin argument `out=PATH` (stderr without one), and with
 * `symbols=on` each function's count after it (`symbol COUNT NAME`, largest first), and with
 * `blocks=on` each translated block's (`block COUNT VADDR SYMBOL`, by address: map a block
 * to its source lines with addr2line after subtracting the load base).
 *
 * The counter is one plain variable: exact for a guest that runs one thread at a time
 * (the counts are taken with one compute thread); guest threads running at once could
 * lose increments. Written for the plugin API of QEMU 7.2 (QEMU_PLUGIN_VERSION 1), whose
 * header the xtask downloads from the installed qemu-user's Debian source.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

static uint64_t executed;
static char out_path[4096];

/* With `symbols=on`, also per function: each translated block's count goes to the symbol
 * of its first instruction (qemu's best-effort lookup; "?" without one). */
#define MAX_SYMBOLS 16384
struct symbol_count {
    const char *name;
    uint64_t count;
};
static struct symbol_count symbols[MAX_SYMBOLS];
static size_t n_symbols;
static int by_symbol;

/* With `blocks=on`, per block start address (a block translated again adds to the same
 * entry). */
#define MAX_BLOCKS (1u << 20)
struct block_count {
    uint64_t vaddr;
    uint64_t count;
    const char *symbol;
};
static struct block_count blocks[MAX_BLOCKS];
static int by_block;

static struct block_count *block_of(uint64_t vaddr, const char *symbol)
{
    uint64_t h = vaddr * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < MAX_BLOCKS; i++) {
        struct block_count *b = &blocks[(h + i) % MAX_BLOCKS];
        if (b->count == 0 && b->symbol == NULL) {
            b->vaddr = vaddr;
            b->symbol = strdup(symbol ? symbol : "?");
            return b;
        }
        if (b->vaddr == vaddr) {
            return b;
        }
    }
    return NULL;
}

static struct symbol_count *slot_of(const char *name)
{
    if (!name) {
        name = "?";
    }
    uint64_t h = 1469598103934665603ull;
    for (const char *c = name; *c; c++) {
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    }
    for (size_t i = 0; i < MAX_SYMBOLS; i++) {
        struct symbol_count *s = &symbols[(h + i) % MAX_SYMBOLS];
        if (!s->name) {
            if (n_symbols + 1 >= MAX_SYMBOLS) {
                return NULL;
            }
            s->name = strdup(name);
            n_symbols++;
            return s;
        }
        if (strcmp(s->name, name) == 0) {
            return s;
        }
    }
    return NULL;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &executed, n);
    if (by_symbol && n > 0) {
        struct symbol_count *s = slot_of(qemu_plugin_insn_symbol(qemu_plugin_tb_get_insn(tb, 0)));
        if (s) {
            qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &s->count, n);
        }
    }
    if (by_block && n > 0) {
        struct qemu_plugin_insn *first = qemu_plugin_tb_get_insn(tb, 0);
        struct block_count *b = block_of(qemu_plugin_tb_vaddr(tb), qemu_plugin_insn_symbol(first));
        if (b) {
            qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &b->count, n);
        }
    }
}

static int by_count(const void *a, const void *b)
{
    const struct symbol_count *x = a, *y = b;
    return x->count < y->count ? 1 : x->count > y->count ? -1 : 0;
}

static void at_exit(qemu_plugin_id_t id, void *data)
{
    (void)id;
    (void)data;
    FILE *f = out_path[0] ? fopen(out_path, "w") : NULL;
    FILE *o = f ? f : stderr;
    fprintf(o, "instructions %" PRIu64 "\n", executed);
    if (by_symbol) {
        static struct symbol_count used[MAX_SYMBOLS];
        size_t k = 0;
        for (size_t i = 0; i < MAX_SYMBOLS; i++) {
            if (symbols[i].name && symbols[i].count) {
                used[k++] = symbols[i];
            }
        }
        qsort(used, k, sizeof used[0], by_count);
        for (size_t i = 0; i < k; i++) {
            fprintf(o, "symbol %" PRIu64 " %s\n", used[i].count, used[i].name);
        }
    }
    if (by_block) {
        for (size_t i = 0; i < MAX_BLOCKS; i++) {
            if (blocks[i].count) {
                fprintf(o, "block %" PRIu64 " %" PRIx64 " %s\n", blocks[i].count, blocks[i].vaddr,
                        blocks[i].symbol);
            }
        }
    }
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
        } else if (strcmp(argv[i], "symbols=on") == 0) {
            by_symbol = 1;
        } else if (strcmp(argv[i], "blocks=on") == 0) {
            by_block = 1;
        } else {
            fprintf(stderr, "insn_count: unknown argument '%s' (expected out=PATH, symbols=on, blocks=on)\n",
                    argv[i]);
            return -1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
