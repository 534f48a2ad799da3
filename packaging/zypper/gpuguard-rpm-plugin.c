/* gpuguard's rpm transaction plugin: the veto under zypper (and every other rpm front end).
 *
 * librpm loads it for every transaction through %__transaction_gpuguard (packaging/zypper/macros.gpuguard).
 * Its tsm_pre hook runs before rpm changes anything: it writes the transaction's elements and the installed set,
 * one tab-separated line each, to the hook command (%_gpuguard_hook, agent/guard/zypper/rpm_hook.py) on its stdin:
 *
 *     root<TAB>/
 *     parent<TAB>4242                                          the process that ran rpm (zypper, zypp-rpm, ...)
 *     I<TAB>name<TAB>epoch<TAB>version<TAB>release<TAB>arch     installed now
 *     +<TAB>...                                                coming in (install, upgrade, downgrade)
 *     -<TAB>...                                                going out (erase, the old side of an upgrade)
 *     end
 *
 * and fails the transaction (RPMRC_FAIL: rpm stops before its first change) unless the hook exits 0. Anything that
 * keeps the hook from answering (no hook, a crash, a signal) fails the transaction too: the guard fails closed.
 *
 * rpm 4.14 does not install its plugin header (lib/rpmplugin.h; 4.20 does); the hook table below repeats its leading
 * members, which are the same from rpm 4.12 to 6.0 (init, cleanup, tsm_pre, ...), and leaves every later hook NULL.
 *
 * Built by packaging/build.py (build_rpm_plugin) WITHOUT -lrpm -lrpmio: the .so needs no particular librpm soname
 * (SLES 15 has librpm.so.8, SLES 16 librpm.so.10); the librpm calls below bind to the librpm of the rpm process
 * that dlopens it. Only API present with the same prototype in rpm 4.14.3 and 4.20.0 may be called here: a new
 * call must be checked there and added to CHECKED_RPM_API in tests/packaging/test_targets_2026.py
 * (packaging/zypper/README.md says what was checked).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rpm/header.h>
#include <rpm/rpmdb.h>
#include <rpm/rpmmacro.h>
#include <rpm/rpmte.h>
#include <rpm/rpmts.h>

typedef struct rpmPlugin_s *rpmPlugin;
typedef rpmRC (*plugin_init_func)(rpmPlugin plugin, rpmts ts);
typedef void (*plugin_cleanup_func)(rpmPlugin plugin);
typedef rpmRC (*plugin_tsm_pre_func)(rpmPlugin plugin, rpmts ts);

struct gpuguard_hooks_s {
    plugin_init_func init;
    plugin_cleanup_func cleanup;
    plugin_tsm_pre_func tsm_pre;
    void *later_hooks[32];
};

#define MAX_HOOK_ARGS 32

static int write_all(int fd, const char *text)
{
    size_t left = strlen(text);
    while (left > 0) {
        ssize_t n = write(fd, text, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        text += n;
        left -= (size_t) n;
    }
    return 0;
}

static int write_package(int fd, const char *kind, const char *name, const char *epoch, const char *version,
                         const char *release, const char *arch)
{
    char line[4096];
    int n = snprintf(line, sizeof(line), "%s\t%s\t%s\t%s\t%s\t%s\n", kind, name ? name : "", epoch ? epoch : "",
                     version ? version : "", release ? release : "", arch ? arch : "");
    if (n < 0 || (size_t) n >= sizeof(line))
        return -1;
    return write_all(fd, line);
}

static int write_transaction(int fd, rpmts ts)
{
    const char *root = rpmtsRootDir(ts);
    char line[4096];
    int n = snprintf(line, sizeof(line), "root\t%s\n", root && *root ? root : "/");
    if (n < 0 || (size_t) n >= sizeof(line) || write_all(fd, line))
        return -1;
    n = snprintf(line, sizeof(line), "parent\t%ld\n", (long) getppid());
    if (n < 0 || (size_t) n >= sizeof(line) || write_all(fd, line))
        return -1;

    rpmdbMatchIterator mi = rpmtsInitIterator(ts, RPMDBI_PACKAGES, NULL, 0);
    if (mi == NULL)
        return -1;
    Header h;
    int failed = 0;
    while (!failed && (h = rpmdbNextIterator(mi)) != NULL) {
        char epoch[32];
        if (headerIsEntry(h, RPMTAG_EPOCH))
            snprintf(epoch, sizeof(epoch), "%llu", (unsigned long long) headerGetNumber(h, RPMTAG_EPOCH));
        else
            epoch[0] = '\0';
        const char *name = headerGetString(h, RPMTAG_NAME);
        if (name && strcmp(name, "gpg-pubkey") == 0)
            continue;
        failed = write_package(fd, "I", name, epoch, headerGetString(h, RPMTAG_VERSION),
                               headerGetString(h, RPMTAG_RELEASE), headerGetString(h, RPMTAG_ARCH));
    }
    rpmdbFreeIterator(mi);

    rpmtsi pi = rpmtsiInit(ts);
    rpmte te;
    while (!failed && (te = rpmtsiNext(pi, 0)) != NULL) {
        const char *kind = rpmteType(te) == TR_ADDED ? "+" : "-";
        failed = write_package(fd, kind, rpmteN(te), rpmteE(te), rpmteV(te), rpmteR(te), rpmteA(te));
    }
    rpmtsiFree(pi);
    return failed || write_all(fd, "end\n");
}

static rpmRC gpuguard_tsm_pre(rpmPlugin plugin, rpmts ts)
{
    (void) plugin;
    char *hook = rpmExpand("%{?_gpuguard_hook}", NULL);
    char *args = rpmExpand("%{?_gpuguard_hook_args}", NULL);
    char *argv[MAX_HOOK_ARGS + 2];
    int argc = 0;
    rpmRC rc = RPMRC_FAIL;

    if (hook == NULL || *hook == '\0') {
        fprintf(stderr, "gpuguard: REFUSED by fail-safe: the rpm plugin has no %%_gpuguard_hook macro "
                        "(reinstall gpuguard)\n");
        goto exit;
    }
    argv[argc++] = hook;
    for (char *word = strtok(args, " \t"); word && argc <= MAX_HOOK_ARGS; word = strtok(NULL, " \t"))
        argv[argc++] = word;
    argv[argc] = NULL;

    int pipefd[2];
    if (pipe(pipefd) != 0) {
        fprintf(stderr, "gpuguard: REFUSED by fail-safe: cannot start %s (%s)\n", hook, strerror(errno));
        goto exit;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "gpuguard: REFUSED by fail-safe: cannot start %s (%s)\n", hook, strerror(errno));
        close(pipefd[0]);
        close(pipefd[1]);
        goto exit;
    }
    if (pid == 0) {
        dup2(pipefd[0], STDIN_FILENO);
        close(pipefd[0]);
        close(pipefd[1]);
        dup2(STDERR_FILENO, STDOUT_FILENO);  /* the hook's lines end up where rpm's own messages go */
        execv(hook, argv);
        fprintf(stderr, "gpuguard: REFUSED by fail-safe: cannot run %s (%s)\n", hook, strerror(errno));
        _exit(127);
    }
    close(pipefd[0]);
    void (*old_sigpipe)(int) = signal(SIGPIPE, SIG_IGN);
    write_transaction(pipefd[1], ts);  /* a hook that stopped reading decides by itself (its exit status) */
    close(pipefd[1]);
    signal(SIGPIPE, old_sigpipe);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            status = -1;
            break;
        }
    }
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        rc = RPMRC_OK;
    else if (status == -1 || !WIFEXITED(status))
        fprintf(stderr, "gpuguard: REFUSED by fail-safe: %s ended without a verdict\n", hook);

exit:
    free(hook);
    free(args);
    return rc;
}

struct gpuguard_hooks_s gpuguard_hooks = {
    .init = NULL,
    .cleanup = NULL,
    .tsm_pre = gpuguard_tsm_pre,
};
