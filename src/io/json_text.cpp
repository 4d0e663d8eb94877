// Nesting depth is checked by a pre-scan before nlohmann sees the text, so
// the parser never builds (or unwinds) a deep structure; duplicate keys are
// caught with nlohmann's parse callback, one key set per open object.
#include "io/json_text.h"

#include <set>
#include <vector>

#include "core/mapped_file.h"

namespace kvant {
namespace {

// Returns the offset of the first bracket that exceeds kMaxJsonDepth, or
// npos. Brackets inside strings do not count; malformed text is left for
// the real parser to reject.
size_t find_too_deep(std::string_view s) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace

Result<nlohmann::json> parse_json_text(std::string_view text, const std::string& what,
                                       uint64_t base_offset) {
  if (size_t deep = find_too_deep(text); deep != std::string_view::npos)
    return make_error(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels at offset " + std::to_string(base_offset + deep));
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  using Json = nlohmann::json;
  Json::parser_callback_t cb = [&](int, Json::parse_event_t ev, Json& parsed) {
    switch (ev) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    Json j = Json::parse(text.begin(), text.end(), cb);
    if (!duplicate.empty()) return make_error(what + ": duplicate JSON key \"" + duplicate + "\"");
    return j;
  } catch (const Json::parse_error& e) {
    // e.byte is 1-based: the position of the character that failed.
    const uint64_t at = base_offset + (e.byte > 0 ? e.byte - 1 : 0);
    return make_error(what + ": invalid JSON at offset " + std::to_string(at) + ": " + e.what());
  } catch (const Json::exception& e) {
    return make_error(what + ": invalid JSON: " + e.what());
  }
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  auto f = MappedFile::open(path);
  if (!f) return f.error();
  const auto b = f->bytes();
  return parse_json_text(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()), path);
}

}  // namespace kvant
