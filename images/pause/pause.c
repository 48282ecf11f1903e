/*
 * The pod sandbox's pause process (service-mirror.local/pause), and the pid-1 reaper of
 * each test node's pid namespace. It holds the namespaces open and does nothing else:
 * waits in sigsuspend, reaps every exited child (as pid 1 it inherits orphans), and exits
 * 0 on SIGTERM or SIGINT. Built by scripts/build-images.sh with `gcc -static -Os`.
 */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) { (void)sig; stop = 1; }

/* The work happens in the loop below; the handler only interrupts sigsuspend. */
static void on_child(int sig) { (void)sig; }

int main(void) {
  sigset_t blocked, waiting;
  struct sigaction sa;

  /* Block the signals we handle, so none arrives between the checks and sigsuspend. */
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGCHLD);
  sigprocmask(SIG_BLOCK, &blocked, &waiting);
  sigdelset(&waiting, SIGTERM);
  sigdelset(&waiting, SIGINT);
  sigdelset(&waiting, SIGCHLD);

  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigaction(SIGTERM, &sa, 0);
  sigaction(SIGINT, &sa, 0);
  sa.sa_handler = on_child;
  sigaction(SIGCHLD, &sa, 0);

  while (!stop) {
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
    sigsuspend(&waiting);
  }
  return 0;
}
