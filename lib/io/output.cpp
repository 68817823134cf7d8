// The output rule (output.hpp).
#include "io/output.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"
#include "io/hdf5.hpp"

namespace mtplab::io {
namespace {

namespace fs = std::filesystem;

std::string article(const std::string& what) {
  return (!what.empty() && std::string("aeiou").find(what[0]) != std::string::npos ? "an " : "a ") + what;
}

// A write lock over the whole file, for fcntl.
struct flock whole_file(short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;
  return fl;
}

// The holder's line from an open lock file ("" when empty or unreadable).
std::string read_holder(int fd) {
  char buf[1024];
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

std::string utc_text() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::string output_lock_path(const std::string& path) { return path + ".lock"; }

OutputLock::OutputLock(const std::string& path, const std::string& command) {
  const std::string lock = output_lock_path(path);
  // A holder that ends removes the file after we opened it: then we hold a lock on a name that no
  // longer exists, so the claim is taken again on the file now at that name.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    MTP_REQUIRE(fd >= 0, path, ": cannot create ", lock,
                " (the claim that one run writes this output): ", std::strerror(errno));
    struct flock fl = whole_file(F_WRLCK);
    if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
      const int err = errno;
      if (err == EAGAIN || err == EACCES) {
        const std::string holder = read_holder(fd);
        ::close(fd);
        MTP_FAIL(another_writer_message(path, holder.empty() ? str("its claim ", lock, " is held") : holder));
      }
      ::close(fd);
      if (err == ENOLCK || err == EINVAL || err == ENOSYS || err == EOPNOTSUPP) {
        log_warn(path, ": the file system refuses locks (", std::strerror(err),
                 "), so another run writing this output is found only when one of them adds a point");
        return;
      }
      MTP_FAIL(path, ": cannot lock ", lock, ": ", std::strerror(err));
    }
    struct stat held {
    }, named{};
    if (::fstat(fd, &held) != 0 || ::stat(lock.c_str(), &named) != 0 || held.st_dev != named.st_dev ||
        held.st_ino != named.st_ino) {
      ::close(fd);  // the holder removed it meanwhile: try the file now there
      continue;
    }
    const std::string line = str("pid ", ::getpid(), " on host ", process_identity().host, ": ", command,
                                 ", since ", utc_text(), "\n");
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
      log_warn(lock, ": cannot write who holds the claim: ", std::strerror(errno));
    fd_ = fd;
    lock_path_ = lock;
    return;
  }
  MTP_FAIL(path, ": cannot take the claim ", lock, ": it is replaced faster than it can be locked");
}

OutputLock::~OutputLock() { release(); }

OutputLock::OutputLock(OutputLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), lock_path_(std::move(other.lock_path_)) {}

OutputLock& OutputLock::operator=(OutputLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    lock_path_ = std::move(other.lock_path_);
  }
  return *this;
}

void OutputLock::release() noexcept {
  if (fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still locked: a waiting writer then retries on a new file
  ::close(fd_);
  fd_ = -1;
}

std::string another_writer_message(const std::string& path, const std::string& holder) {
  return str(path, ": another run is writing this output (", holder,
             "); two runs into one output would compute the same points twice. Wait for it to end (a rerun "
             "then adds only what is missing), or choose another output (--out)");
}

std::string output_lock_holder(const std::string& path) {
  const std::string lock = output_lock_path(path);
  const int fd = ::open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct flock fl = whole_file(F_WRLCK);
  std::string holder;
  if (::fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) {
    holder = read_holder(fd);
    if (holder.empty()) holder = str("its claim ", lock, " is held");
  }
  ::close(fd);
  return holder;
}

std::string describe_existing_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st)) return "a directory";
  if (!fs::is_regular_file(st)) return "something other than a regular file";
  try {
    const H5File f = H5File::open_read(path);
    // The kinds mtplab writes (io/trace.hpp, harness/results.hpp).
    if (f.has_attr("format") && f.attr_info("format").kind == AttrKind::string &&
        f.attr_string("format") == "mtplab-trace")
      return "an mtplab trace";
    if (f.has_attr("schema") && f.attr_info("schema").kind == AttrKind::string &&
        f.attr_string("schema") == "mtplab-results")
      return "an mtplab results file";
    return "an HDF5 file that mtplab did not write";
  } catch (const Error&) {
    return "a file that is not HDF5 (or that HDF5 cannot read)";
  }
}

std::string follow_output_link(const std::string& path) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return path;
  const fs::path canonical = fs::canonical(path, ec);
  return ec ? path : canonical.string();
}

OutputCheck check_output(const std::string& command, const std::string& path, const OutputKind& kind,
                         const std::vector<std::string>& inputs, OutputMode mode) {
  OutputCheck out;
  out.path = path;
  if (path.empty()) {
    out.problems.push_back(str(command, ": the output path is empty"));
    return out;
  }
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path, ec))) {
    // A link is followed to what it points at; one that points nowhere is refused (writing it
    // would replace the link with a regular file).
    out.path = follow_output_link(path);
    if (out.path == path) {
      std::error_code ec2;
      out.problems.push_back(str(path, ": is a symbolic link to ", fs::read_symlink(path, ec2).string(),
                                 ", which does not exist; ", command,
                                 " never replaces a link: give the path of the file to write"));
      return out;
    }
  }
  const std::string shown = out.path == path ? path : str(path, " (", out.path, ")");
  const fs::file_status st = fs::status(out.path, ec);
  if (!fs::exists(st)) return out;
  for (const auto& in : inputs) {
    std::error_code e;
    if (!in.empty() && fs::equivalent(out.path, in, e) && !e) {
      out.problems.push_back(str(shown, ": is also an input of ", command, " (", in,
                                 "; another spelling or a link of the same file); write to a new file"));
      return out;
    }
  }
  if (!fs::is_regular_file(st)) {
    out.problems.push_back(str(shown, ": exists and is ", describe_existing_file(out.path), "; ", command,
                               " writes ", article(kind.what), ": choose another output"));
    return out;
  }
  bool own = false;
  try {
    const H5File f = H5File::open_read(out.path);
    own = f.has_attr(kind.attribute) && f.attr_info(kind.attribute).kind == AttrKind::string &&
          f.attr_string(kind.attribute) == kind.value;
  } catch (const Error&) {
    own = false;
  }
  if (!own) {
    out.problems.push_back(str(shown, ": exists and is ", describe_existing_file(out.path), ", not ",
                               article(kind.what), "; ", command,
                               " never replaces another kind of file (not even with --force): "
                               "choose another output or delete the file yourself"));
    return out;
  }
  out.exists = true;
  if (mode == OutputMode::create)
    out.problems.push_back(str(shown, ": exists (", article(kind.what), "); ", command,
                               " replaces it only with --force: pass --force, or choose another output"));
  return out;
}

std::string resolve_output(const std::string& command, const std::string& path, const OutputKind& kind,
                           const std::vector<std::string>& inputs, OutputMode mode) {
  const OutputCheck c = check_output(command, path, kind, inputs, mode);
  MTP_REQUIRE(c.problems.empty(), join(c.problems, "\n"));
  return c.path;
}

}  // namespace mtplab::io
