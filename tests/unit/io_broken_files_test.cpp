// The broken-file corpus (tools/fixtures/gen_broken.py): every case must
// fail to open, or fail when its tensors are read, with an error that names
// the file and the substrings manifest.tsv lists (field, tensor, offset).
// Reaching the end of the test at all means nothing crashed.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "io/tensor_source.h"

namespace kvant {
namespace {

const std::string kBroken = std::string(KVANT_FIXTURES) + "/io/broken/";

struct Case {
  std::string name;
  std::vector<std::string> expect;
};

std::vector<Case> load_manifest() {
  std::vector<Case> cases;
  std::ifstream f(kBroken + "manifest.tsv");
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::stringstream ss(line);
    Case c;
    std::getline(ss, c.name, '\t');
    for (std::string s; std::getline(ss, s, '\t');) c.expect.push_back(s);
    cases.push_back(std::move(c));
  }
  return cases;
}

// The first error opening `path` or reading any of its tensors.
std::string first_error(const std::string& path) {
  auto src = open_tensor_source(path);
  if (!src) return src.error().message;
  std::vector<float> buf;
  for (const auto& t : (*src)->tensors()) {
    buf.resize(size_t(t.numel()));
    auto r = (*src)->read_f32(t, buf);
    if (!r) return r.error().message;
  }
  return "";
}

TEST(IoBrokenFiles, EveryCaseFailsWithAClearMessage) {
  const auto cases = load_manifest();
  ASSERT_GE(cases.size(), 15u);
  for (const auto& c : cases) {
    const std::string path = kBroken + c.name;
    const std::string err = first_error(path);
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(err.empty()) << "opened and read without error";
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    EXPECT_NE(err.find(path), std::string::npos) << "path missing from: " << err;
    for (const auto& e : c.expect)
      EXPECT_NE(err.find(e), std::string::npos) << "\"" << e << "\" missing from: " << err;
  }
}

TEST(IoBrokenFiles, ValidSeedsOpen) {
  for (const char* f : {"valid.gguf", "valid.safetensors"}) {
    const std::string path = std::string(KVANT_FIXTURES) + "/io/" + f;
    EXPECT_EQ(first_error(path), "") << path;
  }
}

}  // namespace
}  // namespace kvant
