// Helpers shared by the filter files (jinja_filters.cpp,
// jinja_filters_text.cpp). Internal to the interpreter.
#pragma once

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja_interp.h"
#include "tokenizer/jinja_text.h"

namespace kvant::jinja {

// Binds a filter's arguments to its parameter names, as a Python call does.
class Params {
 public:
  Params(const Args& a, std::initializer_list<std::string_view> names, std::string_view fn)
      : names_(names) {
    vals_.assign(names_.size(), nullptr);
    if (a.pos.size() > names_.size())
      raise(std::string(fn) + "() takes at most " + std::to_string(names_.size() + 1) +
            " positional arguments (" + std::to_string(a.pos.size() + 1) + " given)");
    for (size_t i = 0; i < a.pos.size(); ++i) vals_[i] = &a.pos[i];
    for (const auto& [k, v] : a.kw) {
      auto it = std::find(names_.begin(), names_.end(), k);
      if (it == names_.end())
        raise(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
      vals_[size_t(it - names_.begin())] = &v;
    }
  }
  bool has(size_t i) const { return vals_[i] != nullptr; }
  Value get(size_t i, Value dflt) const { return vals_[i] ? *vals_[i] : std::move(dflt); }
  bool flag(size_t i) const { return vals_[i] && vals_[i]->truthy(); }
  int64_t integer(size_t i, int64_t dflt) const {
    if (!vals_[i] || vals_[i]->is_none()) return dflt;
    if (!vals_[i]->is_number())
      raise("'" + std::string(vals_[i]->type_name()) +
            "' object cannot be interpreted as an integer");
    return vals_[i]->is_float() ? int64_t(vals_[i]->as_float()) : vals_[i]->to_int();
  }

 private:
  std::vector<std::string_view> names_;
  std::vector<const Value*> vals_;
};

inline std::string soft_str(const Value& v) { return v.is_string() ? v.str() : py_str(v); }
inline Value str_value(Interp& in, std::string s) {
  in.check_size(s.size());
  in.charge(s.size() / 64);
  return Value::string(std::move(s));
}
inline Value generator(List xs) { return Value::seq(std::move(xs), SeqKind::Generator); }

// make_attrgetter: "a.b.0" looks up a, then b, then item 0 (getitem rules).
inline Value attr_path(Interp& in, Value v, const Value& attribute) {
  if (!attribute.is_string()) return in.getitem(v, attribute);
  std::string_view path = attribute.str();
  while (true) {
    const size_t dot = path.find('.');
    const std::string part(path.substr(0, dot));
    int64_t index = 0;
    const auto r = std::from_chars(part.data(), part.data() + part.size(), index);
    const bool digits = !part.empty() && part[0] != '-' && r.ec == std::errc() &&
                        r.ptr == part.data() + part.size();
    v = digits ? in.getitem(v, Value::integer(index)) : in.getitem(v, Value::string(part));
    if (dot == std::string_view::npos) return v;
    path.remove_prefix(dot + 1);
  }
}

inline Value ignore_case(const Value& v) {
  return v.is_string() ? Value::string(py_lower(v.str())) : v;
}

using FilterTable = std::unordered_map<std::string_view, FilterFn>;
// The sequence and data filters of jinja_filters.cpp.
void add_sequence_filters(FilterTable& t);

}  // namespace kvant::jinja
