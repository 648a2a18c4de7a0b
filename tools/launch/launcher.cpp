#include "launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace mhccl::launch {
namespace {

volatile sig_atomic_t g_interrupted = 0;
void on_signal(int) { g_interrupted = 1; }

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string pending;  // output not yet ended by a newline
  size_t scanned = 0;   // pending's bytes already searched for one (none there)
  bool exited = false;
  int code = 0;
};

// Forwards the complete lines of c.pending, each whole after the rank's prefix (the ranks share
// stdout: a line is never split), bytes as they are (a NUL included); `final`: the rest too,
// ended by a newline. Each byte is searched for a newline once: a rank writing 128 MB without
// one took the launcher 44 s when its whole pending output was searched again at every 8 KiB
// read (the rank blocked on its full pipe meanwhile).
void flush_lines(Child& c, int rank, bool prefix, bool final) {
  size_t start = 0;
  for (;;) {
    const size_t nl = c.pending.find('\n', std::max(start, c.scanned));
    if (nl == std::string::npos) break;
    if (prefix) std::printf("[rank %d] ", rank);
    std::fwrite(c.pending.data() + start, 1, nl + 1 - start, stdout);
    start = nl + 1;
  }
  c.pending.erase(0, start);
  c.scanned = c.pending.size();
  if (final && !c.pending.empty()) {
    if (prefix) std::printf("[rank %d] ", rank);
    std::fwrite(c.pending.data(), 1, c.pending.size(), stdout);
    std::fputc('\n', stdout);
    c.pending.clear();
    c.scanned = 0;
  }
  std::fflush(stdout);
}

int decode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

Result run(const Options& opts) {
  Result res;
  const int n = opts.nprocs;
  res.rank_codes.assign(n, -1);
  char dir_template[] = "/tmp/mhccl-launch-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  const std::string id_file = dir ? std::string(dir) + "/nccl_unique_id" : "";
  std::vector<Child> children(n);
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t group = 0;
  // A rank that cannot be started: the ranks already started are killed and reaped, nothing is left.
  auto abandon = [&](const char* what) {
    std::perror(what);
    if (group > 0) killpg(group, SIGKILL);
    for (Child& c : children) {
      if (c.fd >= 0) close(c.fd);
      if (c.pid > 0) waitpid(c.pid, nullptr, 0);
    }
    if (dir) std::filesystem::remove_all(dir);
    res.exit_code = 1;
    return res;
  };
  // A rank forked but not yet exec'd runs with the launcher's handlers, and a stop signal (the
  // group stopped early, a rank having failed) would only set the child's copy of the flag and
  // be lost: the rank then ran on until the SIGKILL after the grace (a CPU test under load,
  // 2026-12-05). So SIGINT and SIGTERM are blocked across the fork, and the child restores their
  // default actions before it unblocks them: one sent meanwhile ends it.
  sigset_t stop_signals, unblocked;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  for (int r = 0; r < n; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return abandon("mhccl-launch: pipe");
    sigprocmask(SIG_BLOCK, &stop_signals, &unblocked);
    const pid_t pid = fork();
    if (pid != 0) sigprocmask(SIG_SETMASK, &unblocked, nullptr);
    if (pid < 0) {
      close(fds[0]);
      close(fds[1]);
      return abandon("mhccl-launch: fork");
    }
    if (pid == 0) {
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      sigprocmask(SIG_SETMASK, &unblocked, nullptr);
      setpgid(0, group);
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      setenv("MHCCL_RANK", std::to_string(r).c_str(), 1);
      setenv("MHCCL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      setenv("MHCCL_LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("MHCCL_UNIQUE_ID_FILE", id_file.c_str(), 1);
      for (const auto& [k, v] : opts.env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (const std::string& a : opts.argv) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      std::fprintf(stderr, "mhccl-launch: cannot run %s: %s\n", argv[0], std::strerror(errno));
      _exit(127);
    }
    if (group == 0) group = pid;
    setpgid(pid, group);
    close(fds[1]);
    children[r].pid = pid;
    children[r].fd = fds[0];
  }

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  bool killing = false;
  auto failed_at = clock::now();
  std::string failure;
  auto kill_time = clock::now();
  // Once every rank exited, its output pipe is read for at most kDrainS more: a process a rank
  // left behind in a session of its own (`setsid cmd &`) keeps the pipe open beyond the reach of
  // killpg, and waiting for its end of file outlived the deadline (30 s of its sleep, or for ever;
  // a review, 2026-12-05). Then what the pipe holds is read without waiting (everything a rank
  // wrote before it exited is there, however slow our own stdout was), the rest of the ranks'
  // group is stopped, and the pipe closed.
  constexpr double kDrainS = 2.0;
  bool all_exited = false;
  auto all_exited_at = clock::now();
  auto kill_group = [&](const char* why) {
    if (killing) return;
    killing = true;
    kill_time = clock::now();
    std::fprintf(stdout, "mhccl-launch: %s: stopping every rank\n", why);
    std::fflush(stdout);
    killpg(group, SIGTERM);
  };
  // One read of rank r's pipe, its whole lines forwarded: the bytes read, 0 at the pipe's end,
  // -1 where nothing was there (O_NONBLOCK) or on an error.
  auto read_some = [&](int r) -> ssize_t {
    Child& c = children[r];
    char buf[8192];
    const ssize_t got = read(c.fd, buf, sizeof buf);
    if (got > 0) {
      c.pending.append(buf, static_cast<size_t>(got));
      flush_lines(c, r, opts.prefix_output, false);
    }
    return got;
  };
  auto close_pipe = [&](int r) {  // its last, unterminated line forwarded too
    Child& c = children[r];
    flush_lines(c, r, opts.prefix_output, true);
    close(c.fd);
    c.fd = -1;
  };
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<int> owner;
    for (int r = 0; r < n; ++r) {
      if (children[r].fd >= 0) { pfds.push_back({children[r].fd, POLLIN, 0}); owner.push_back(r); }
    }
    if (!pfds.empty()) poll(pfds.data(), pfds.size(), 100);
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (read_some(owner[i]) <= 0) close_pipe(owner[i]);
    }
    bool all_done = true, exited = true;
    for (int r = 0; r < n; ++r) {
      Child& c = children[r];
      if (!c.exited) {
        int status = 0;
        if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
          c.exited = true;
          c.code = decode_status(status);
          res.rank_codes[r] = c.code;
          if (c.code != 0 && c.code != 77 && res.failed_rank < 0 && !killing) {
            res.failed_rank = r;
            failed_at = clock::now();
            failure = "rank " + std::to_string(r) + " exited with " + std::to_string(c.code);
            if (opts.grace_s > 0) {
              std::fprintf(stdout, "mhccl-launch: %s: the other ranks have %g s to end\n", failure.c_str(), opts.grace_s);
              std::fflush(stdout);
            }
          }
        }
      }
      exited = exited && c.exited;
      all_done = all_done && c.exited && c.fd < 0;
    }
    if (all_done) break;
    if (exited && !all_exited) {
      all_exited = true;
      all_exited_at = clock::now();
    }
    if (all_exited && std::chrono::duration<double>(clock::now() - all_exited_at).count() > kDrainS) {
      killpg(group, SIGKILL);  // what the ranks left in their group (out of it: not reachable)
      for (int r = 0; r < n; ++r) {
        Child& c = children[r];
        if (c.fd < 0) continue;
        fcntl(c.fd, F_SETFL, fcntl(c.fd, F_GETFL) | O_NONBLOCK);
        // At most 64 MiB, should a writer never stop.
        ssize_t got = 1;
        for (size_t taken = 0; taken < (size_t{64} << 20) && (got = read_some(r)) > 0;) taken += static_cast<size_t>(got);
        close_pipe(r);
        if (got != 0) {  // not the pipe's end
          std::fprintf(stdout, "mhccl-launch: rank %d exited, but a process it left behind still holds its output "
                       "open: not waiting for it\n", r);
          std::fflush(stdout);
        }
      }
      break;
    }
    if (res.failed_rank >= 0 && !killing &&
        std::chrono::duration<double>(clock::now() - failed_at).count() >= opts.grace_s) {
      kill_group(failure.c_str());
    }
    const double elapsed = std::chrono::duration<double>(clock::now() - start).count();
    if (opts.timeout_s > 0 && elapsed > opts.timeout_s && !killing && !all_exited) {  // exited in time: no timeout
      res.timed_out = true;
      kill_group(("deadline of " + std::to_string(static_cast<int>(opts.timeout_s)) + " s passed").c_str());
    }
    if (g_interrupted && !killing) kill_group("interrupted");
    if (killing && std::chrono::duration<double>(clock::now() - kill_time).count() > 5.0) {
      killpg(group, SIGKILL);
    }
  }
  if (dir) std::filesystem::remove_all(dir);

  bool all_skipped = n > 0;
  for (int c : res.rank_codes) all_skipped = all_skipped && c == 77;
  if (res.timed_out) {
    res.exit_code = 124;
  } else if (res.failed_rank >= 0) {
    res.exit_code = res.rank_codes[res.failed_rank];
  } else if (all_skipped) {
    res.exit_code = 77;
  } else {
    res.exit_code = 0;
    for (int c : res.rank_codes) if (c != 0 && c != 77) { res.exit_code = c; break; }
  }
  return res;
}

bool write_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && written;
}

bool can_write_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) return false;  // no file: written "there", nothing would be
  // An existing path: anything but a folder that this process may write (a file, /dev/stdout, a pipe).
  if (fs::exists(path, ec)) return !fs::is_directory(path, ec) && access(path.c_str(), W_OK) == 0;
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  return fs::is_directory(dir, ec) && access(dir.c_str(), W_OK) == 0;
}

}  // namespace mhccl::launch
