// The main of a fuzz target's replay test: runs LLVMFuzzerTestOneInput on
// every file of the corpus folders given as arguments (paths relative to the
// test's runfiles), so that the seeds and every crash ever found stay fixed
// in the ordinary test suite, with or without sanitizers.

#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  int files = 0;
  for (int i = 1; i < argc; ++i) {
    DIR* dir = opendir(argv[i]);
    if (dir == nullptr) {
      std::fprintf(stderr, "replay: cannot open corpus folder %s\n", argv[i]);
      return 1;
    }
    std::vector<std::string> names;
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    }
    closedir(dir);
    for (const std::string& name : names) {
      const std::string path = std::string(argv[i]) + "/" + name;
      std::ifstream in(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                             bytes.size());
      ++files;
    }
  }
  std::printf("replay: %d inputs, no crash\n", files);
  // An empty corpus would make the test pass without testing anything.
  return files > 0 ? 0 : 1;
}
