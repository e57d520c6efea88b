// write_file_atomically: the old file or the whole new one, no temporary
// left behind and no other file touched; a failed write is a fault (TrainingError), a file that
// cannot be created is bad input (InputError).
#include "util/Files.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "TestSupport.h"

namespace trainer {
namespace {

// A file-size limit of 16 bytes in a child process (ulimit -f): the write
// of 4 kB fails with EFBIG, as on a full disk.
TEST(Files, AFailedWriteKeepsTheOldFileAndLeavesNoTemporary) {
  const std::string dir = scratch_dir("FilesAtomic");
  const std::string path = write_file(dir + "/summary.json", "old\n");
  const pid_t child = fork();
  if (child == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{16, 16};
    setrlimit(RLIMIT_FSIZE, &limit);
    try {
      write_file_atomically(path, std::string(4096, 'x'));
    } catch (const TrainingError& error) {
      _exit(std::string(error.what()).find("summary.json: write failed") != std::string::npos ? 10 : 11);
    } catch (...) {
      _exit(12);
    }
    _exit(13);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 10) << "11: another message, 12: another exception, 13: no error";
  EXPECT_EQ(read_file(path), "old\n");
  EXPECT_EQ(testing::temporaries_in(dir), std::vector<std::string>{});
  // A directory that does not exist: bad input, naming the file.
  try {
    write_file_atomically(dir + "/missing/summary.json", "x");
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("missing/summary.json: cannot create a file beside it"), std::string::npos)
        << error.what();
  }
  write_file_atomically(path, "new\n");
  EXPECT_EQ(read_file(path), "new\n");
  EXPECT_EQ(testing::temporaries_in(dir), std::vector<std::string>{});
}

// A file named as the write's temporary once was (PATH.tmp, truncated and
// renamed over PATH) is someone's file: the write takes a name of its own,
// exclusively created, with the mode a new file gets (0644 less the umask).
TEST(Files, AnAtomicWriteTouchesNoOtherFile) {
  const std::string dir = scratch_dir("FilesBeside");
  const std::string path = dir + "/summary.json";
  write_file(path + ".tmp", "someone's file\n");
  write_file_atomically(path, "new\n");
  EXPECT_EQ(read_file(path), "new\n");
  EXPECT_EQ(read_file(path + ".tmp"), "someone's file\n");
  EXPECT_EQ(testing::temporaries_in(dir), std::vector<std::string>{"summary.json.tmp"});
  const mode_t old_mask = umask(027);
  write_file_atomically(path, "again\n");
  umask(old_mask);
  struct stat info {};
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0640u);
}

// MadeDirectories removes what it made, deepest first, and only while empty:
// never a directory that was there before, nor one that holds anything.
TEST(Files, MadeDirectoriesGoAgainUnlessKeptOrInUse) {
  namespace fs = std::filesystem;
  const std::string dir = scratch_dir("FilesMade");
  {
    MadeDirectories made;
    std::error_code error;
    made.create(dir + "/a/b/c/", error);  // a trailing separator, three levels missing
    ASSERT_FALSE(error) << error.message();
    made.create(dir + "/a/b/c/d", error);  // inside what it made
    made.create(dir, error);               // there before: never removed
    ASSERT_TRUE(fs::is_directory(dir + "/a/b/c/d"));
  }
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(fs::is_empty(dir));
  {
    MadeDirectories made;
    std::error_code error;
    made.create(dir + "/x/y", error);
    made.create(dir + "/z", error);
    write_file(dir + "/x/note", "someone's\n");  // x holds a file: x stays, y goes
  }
  EXPECT_TRUE(fs::exists(dir + "/x/note"));
  EXPECT_FALSE(fs::exists(dir + "/x/y"));
  EXPECT_FALSE(fs::exists(dir + "/z"));
  {
    MadeDirectories made;
    std::error_code error;
    made.create("files-made-relative/k", error);  // relative to the working directory
    ASSERT_TRUE(fs::is_directory("files-made-relative/k"));
    made.create(dir + "/x/note/under-a-file", error);  // fails: nothing recorded
    EXPECT_TRUE(error);
  }
  EXPECT_FALSE(fs::exists("files-made-relative"));
  {
    MadeDirectories made;
    std::error_code error;
    made.create(dir + "/kept/k", error);
    made.keep();
  }
  EXPECT_TRUE(fs::is_directory(dir + "/kept/k"));
}

}  // namespace
}  // namespace trainer
