// Python's str operations on UTF-8 text, for the Jinja interpreter: the
// whitespace set of str.isspace() and re's \s, strip/split/splitlines,
// case mapping, code point indexing, and the string methods and printf /
// str.format formatting templates call. Internal to the interpreter.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace kvant::jinja {

// Python's str.isspace() for one code point.
bool py_space(uint32_t c);
// Decodes the code point at s[i] and its byte length (a stray byte is itself).
uint32_t code_point_at(std::string_view s, size_t i, size_t& len);
// Offset after the Python whitespace starting at s[i].
size_t skip_space(std::string_view s, size_t i);
// str.strip()/lstrip()/rstrip() with no argument (Unicode whitespace) or with
// a set of characters (code points).
std::string_view py_strip(std::string_view s, bool left, bool right);
std::string_view py_strip_chars(std::string_view s, std::string_view chars, bool left, bool right);
bool is_all_space(std::string_view s);

// Case mapping: ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (other
// scripts are left as they are).
std::string py_lower(std::string_view s);
std::string py_upper(std::string_view s);
std::string py_title(std::string_view s);       // str.title()
std::string py_capitalize(std::string_view s);  // str.capitalize()
std::string jinja_title(std::string_view s);    // the |title filter

// Code points of s, for len() and indexing.
size_t cp_length(std::string_view s);
std::vector<std::string_view> code_points(std::string_view s);

std::vector<std::string> py_split(std::string_view s, const Value& sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const Value& sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl,
                       int64_t count);

// "fmt % args" (printf-style) and "fmt".format(...).
std::string percent_format(std::string_view fmt, const Value& args);
std::string brace_format(std::string_view fmt, const Args& args);

// A method of a str value (s.strip, s.split, ...) bound to it, or an
// Undefined when str has no such attribute.
Value string_method(const Value& s, std::string_view name);

// HTML escaping as markupsafe does it (& < > " ').
std::string html_escape(std::string_view s);

}  // namespace kvant::jinja
