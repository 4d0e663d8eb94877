// The KL baseline file's header (kl_baseline.h).
#include "eval/kl_baseline.h"

#include <filesystem>

namespace kvant::eval {

using nlohmann::json;

Result<KlHeader> read_kl_header(std::ifstream& f, const std::string& path) {
  KlHeader h;
  std::string magic, line;
  if (!std::getline(f, magic) || magic != "KVKL1" || !std::getline(f, line))
    return make_error("eval: " + path + " is not a kvant KL baseline");
  try {
    h.j = json::parse(line);
    h.window = h.j.at("window");
    h.score = h.j.at("score");
    h.k = h.j.at("top_k");
  } catch (const std::exception& e) {
    return make_error("eval: " + path + ": bad header: " + e.what());
  }
  h.header_bytes = magic.size() + line.size() + 2;
  f.seekg(0, std::ios::end);
  const size_t size = size_t(f.tellg());
  h.windows = int64_t((size - h.header_bytes) / h.record_bytes());
  return h;
}

Result<KlHeader> open_kl_save(const std::string& path, const json& hj, bool resume,
                              size_t* have) {
  KlHeader kh;
  kh.j = hj;
  *have = 0;
  if (resume && std::filesystem::exists(path)) {
    std::ifstream f(path, std::ios::binary);
    auto h = read_kl_header(f, path);
    if (h && h->j == hj) {
      *have = size_t(h->windows);
      kh.header_bytes = h->header_bytes;
      return kh;
    }
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << "KVKL1\n" << hj.dump() << "\n";
  if (!f) return make_error("eval: cannot write " + path);
  kh.header_bytes = 7 + hj.dump().size();
  return kh;
}

}  // namespace kvant::eval
