// The output rule of every mtplab command that writes a file (`mtplab run`, `merge`, `trace`):
// one function decides whether a path may be written, so no command replaces what it should not.
//
// The rule (docs/launching.md, "Outputs"):
// - Spellings and links are resolved first: an output that is a symbolic link is followed to the
//   file it points at (that file is written; the link stays a link); a link that points nowhere
//   is refused. The resolved output is then compared with every input by identity (device and
//   inode: another spelling, a link or a hard link of an input is that input): writing an input
//   is refused.
// - An existing output that is not a regular file, or not the command's own kind (an HDF5 file
//   whose root attribute names the kind: a results file for run and merge, a trace for trace), is
//   never replaced, with or without --force: the message says what it is.
// - An existing output of the command's own kind is replaced only with an explicit --force
//   (OutputMode::replace), or added to by a command that resumes it (OutputMode::resume: run).
// The writers below (io::H5File) never rename onto a symbolic link either.
#pragma once
#include <string>
#include <vector>

namespace mtplab::io {

/// A command's own kind of output: an HDF5 file whose root attribute `attribute` is `value`.
struct OutputKind {
  std::string what;       ///< "results file", "trace" (in messages)
  std::string attribute;  ///< "schema", "format"
  std::string value;      ///< "mtplab-results", "mtplab-trace"
};

/// What may happen to an existing output of the command's own kind.
enum class OutputMode {
  create,   ///< refused: the command documents --force to replace it
  replace,  ///< --force was given: replaced
  resume,   ///< the command adds to it (its own checks decide whether it may)
};

/// The verdict on an output path.
struct OutputCheck {
  std::string path;                   ///< the path to write: links resolved (the path itself when absent)
  bool exists = false;                ///< a file of the command's own kind is there
  std::vector<std::string> problems;  ///< each names the path and says why it may not be written
};

/// Applies the rule to `path` for `command` ("mtplab trace"), whose inputs are `inputs` (paths
/// that do not exist are skipped). Writes nothing.
OutputCheck check_output(const std::string& command, const std::string& path, const OutputKind& kind,
                         const std::vector<std::string>& inputs, OutputMode mode);

/// `path` with a symbolic link at its end followed to the file it names (every link on the way
/// resolved); `path` itself when it is no link or a link that points nowhere (check_output
/// refuses that one).
std::string follow_output_link(const std::string& path);

/// check_output, throwing an Error with its problems; returns the path to write.
std::string resolve_output(const std::string& command, const std::string& path, const OutputKind& kind,
                           const std::vector<std::string>& inputs, OutputMode mode);

/// An exclusive claim on an output for the life of one writer, so that two runs into one output
/// never both compute its points: `PATH.lock` beside it, locked with an open-file-description
/// lock (fcntl F_OFD_SETLK), which the kernel releases when the process ends however it ends (a
/// SIGKILL, a crash: no stale claim). The file holds who claims it ("pid P on host H: COMMAND,
/// since T"); it is removed when the claim ends. Where the file system refuses locks (ENOLCK), a
/// warning is logged and the claim is empty: a second writer is then found when it commits.
class OutputLock {
 public:
  OutputLock() = default;
  /// Claims `path` for `command` ("mtplab run exp.yaml"); throws an Error naming the holder when
  /// another process holds it.
  OutputLock(const std::string& path, const std::string& command);
  ~OutputLock();
  OutputLock(OutputLock&& other) noexcept;
  OutputLock& operator=(OutputLock&& other) noexcept;
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  void release() noexcept;
  int fd_ = -1;
  std::string lock_path_;
};

/// The lock file of `path` (`PATH.lock`).
std::string output_lock_path(const std::string& path);

/// Who holds the claim on `path` ("pid P on host H: COMMAND, since T"), "" when no process does.
/// Reads only; creates nothing.
std::string output_lock_holder(const std::string& path);

/// The refusal of a second writer of `path`, whose claim `holder` describes.
std::string another_writer_message(const std::string& path, const std::string& holder);

/// What an existing path is, for messages: "an mtplab trace", "an mtplab results file", "an HDF5
/// file that mtplab did not write", "a file that is not HDF5 ...", "a directory", ...
std::string describe_existing_file(const std::string& path);

}  // namespace mtplab::io
