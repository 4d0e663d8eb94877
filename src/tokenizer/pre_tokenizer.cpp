// PCRE2-backed regex splitting. Compiled code is shared and immutable; the
// match data and JIT stack are per thread, so one Tokenizer may encode on many
// threads at once without locks.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

namespace kvant {
namespace {

// Unicode White_Space, which HF's engine (Oniguruma) means by \s. PCRE2's own
// UCP \s differs (it adds U+180E), so the patterns spell the set out.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

struct ThreadScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadScratch() {
    md = pcre2_match_data_create(16, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    // Long whitespace runs make `\s+(?!\S)` backtrack deeply; the default
    // 32 KiB JIT stack is not enough for megabyte inputs.
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~ThreadScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(mctx);
    pcre2_match_data_free(md);
  }
};

ThreadScratch& scratch() {
  thread_local ThreadScratch s;
  return s;
}

}  // namespace

struct PreTokenizer::Step {
  pcre2_code* code = nullptr;
  ~Step() { pcre2_code_free(code); }
};

std::string rewrite_whitespace_classes(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[i + 1];
      if (n == 's') {
        if (in_class) {
          out.append(kWhiteSpace);
        } else {
          out += '[';
          out.append(kWhiteSpace);
          out += ']';
        }
      } else if (n == 'S' && !in_class) {
        out += "[^";
        out.append(kWhiteSpace);
        out += ']';
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Result<PreTokenizer> PreTokenizer::from_patterns(const std::vector<std::string>& patterns) {
  PreTokenizer pt;
  for (const std::string& raw : patterns) {
    const std::string pat = rewrite_whitespace_classes(raw);
    int err = 0;
    PCRE2_SIZE off = 0;
    auto step = std::make_shared<Step>();
    step->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                               PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!step->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return make_error("pre-tokenizer regex '" + raw + "': " + reinterpret_cast<char*>(msg) +
                        " at offset " + std::to_string(off));
    }
    // JIT is an optimization: the interpreter gives the same matches.
    (void)pcre2_jit_compile(step->code, PCRE2_JIT_COMPLETE);
    pt.steps_.push_back(std::move(step));
  }
  return pt;
}

Result<PreTokenizer> PreTokenizer::for_gguf_pre(std::string_view pre) {
  // Names as llama.cpp's converter writes them for each family's tokenizer.json.
  if (pre == "default" || pre == "gpt2" || pre == "gpt-2")
    return from_patterns({std::string(kGpt2Split)});
  if (pre == "smollm") return from_patterns({std::string(kDigitsSplit), std::string(kGpt2Split)});
  if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "smaug-bpe" ||
      pre == "falcon3" || pre == "dbrx")
    return from_patterns({std::string(kLlama3Split)});
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "megrez")
    return from_patterns({std::string(kQwen2Split)});
  return make_error("unsupported pre-tokenizer '" + std::string(pre) +
                    "' (tokenizer.ggml.pre); known: default, gpt2, smollm, llama-bpe, qwen2");
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  const size_t first = pieces.size();
  pieces.push_back(text);
  std::vector<std::string_view> next;
  ThreadScratch& s = scratch();
  for (const auto& step : steps_) {
    next.clear();
    for (size_t k = first; k < pieces.size(); ++k) {
      const std::string_view piece = pieces[k];
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0, gap = 0;
      while (pos < piece.size()) {
        const int rc =
            pcre2_match(step->code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, s.md, s.mctx);
        if (rc < 0) break;  // no more matches (or a resource error: keep the rest whole)
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
        const size_t b = ov[0], e = ov[1];
        if (e == b) {  // an empty match splits nothing; step over one character
          pos = b + 1;
          while (pos < piece.size() && (uint8_t(piece[pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (b > gap) next.push_back(piece.substr(gap, b - gap));
        next.push_back(piece.substr(b, e - b));
        gap = pos = e;
      }
      if (gap < piece.size()) next.push_back(piece.substr(gap));
    }
    pieces.resize(first);
    pieces.insert(pieces.end(), next.begin(), next.end());
  }
}

}  // namespace kvant
