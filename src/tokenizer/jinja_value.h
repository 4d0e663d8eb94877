// Values of the Jinja interpreter (tokenizer/jinja.h), with the Python
// semantics jinja2 gives them: truthiness, equality and ordering, str() and
// repr() text, and the sandbox's Undefined. Internal to the interpreter.
//
// A Value is small and cheap to copy: strings, sequences and dicts are
// shared and never change once built (the sandbox chat templates run in
// forbids mutating methods such as list.append), so sharing them is
// indistinguishable from Python's references. Namespaces are the one
// mutable kind ({% set ns.x = ... %}) and are shared on purpose.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvant::jinja {

// An error raised while rendering (Python's TemplateError, TypeError, ...).
// Thrown inside the interpreter only; the public API returns it as a Result.
struct RenderError {
  std::string message;
};
[[noreturn]] void raise(std::string message);

class Value;
struct SeqData;
struct Dict;
struct Object;
struct Function;
using List = std::vector<Value>;

// What a sequence is in Python terms: printing, len() and indexing differ.
enum class SeqKind : uint8_t {
  List,
  Tuple,
  Generator,  // filter results such as map/select/unique: no len(), no [i]
  DictItems,  // d.items(), d.keys(), d.values(): len() but no [i]
  DictKeys,
  DictValues,
};

class Value {
 public:
  enum class Type : uint8_t {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    String,
    Seq,
    Dict,
    Object,
    Function
  };

  Value() : Value(Type::Undefined) {}  // an Undefined without a hint
  static Value undefined(std::string hint, bool unsafe = false);
  static Value none() { return Value(Type::None); }
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s, bool markup = false);
  static Value seq(List items, SeqKind kind = SeqKind::List);
  static Value dict(std::shared_ptr<const Dict> d);
  static Value dict(Dict d);
  static Value object(std::shared_ptr<Object> o);
  static Value function(std::shared_ptr<const Function> f);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_int() const { return type_ == Type::Int; }
  bool is_float() const { return type_ == Type::Float; }
  bool is_number() const {
    return type_ == Type::Int || type_ == Type::Float || type_ == Type::Bool;
  }
  bool is_string() const { return type_ == Type::String; }
  bool is_seq() const { return type_ == Type::Seq; }
  bool is_dict() const { return type_ == Type::Dict; }
  bool is_object() const { return type_ == Type::Object; }
  bool is_function() const { return type_ == Type::Function; }
  // Python sequences with len() and [i]: lists and tuples.
  bool is_indexable() const {
    return type_ == Type::Seq && (kind() == SeqKind::List || kind() == SeqKind::Tuple);
  }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }  // Int, or Bool as 0/1 (see to_int)
  double as_float() const { return f_; }
  const std::string& str() const { return *static_cast<const std::string*>(ptr_.get()); }
  bool markup() const { return type_ == Type::String && sub_ != 0; }
  bool unsafe() const { return type_ == Type::Undefined && sub_ != 0; }
  const List& items() const;
  // How many items of a generator have been taken (Python generators yield
  // each item once); always 0 for other sequences.
  size_t& consumed() const;
  SeqKind kind() const { return SeqKind(sub_); }
  const Dict& dict() const { return *static_cast<const Dict*>(ptr_.get()); }
  Object& object() const { return *static_cast<Object*>(ptr_.get()); }
  const Function& function() const { return *static_cast<const Function*>(ptr_.get()); }
  // The message an Undefined raises when it is used (attribute, call, arithmetic).
  std::string undefined_message() const;

  // Numeric views: bool counts as an int, as in Python.
  int64_t to_int() const { return type_ == Type::Bool ? int64_t(b_) : i_; }
  double to_float() const { return type_ == Type::Float ? f_ : double(to_int()); }

  bool truthy() const;
  // Python's type name, as errors print it ('int', 'str', 'list', 'NoneType').
  std::string_view type_name() const;
  // How jinja2 names an object in its undefined messages ("dict object", "None").
  std::string object_type_repr() const;

  bool same_object(const Value& o) const { return ptr_ && ptr_ == o.ptr_; }
  // How deeply lists and dicts nest inside this value (0 for scalars).
  // Building one deeper than kMaxValueDepth raises, which keeps every
  // recursive walk (==, repr, tojson, destruction) within the stack.
  int depth() const { return depth_; }

 private:
  explicit Value(Type t) : type_(t) {}
  Type type_;
  uint8_t sub_ = 0;  // SeqKind, markup flag, unsafe flag
  uint16_t depth_ = 0;
  union {
    bool b_;
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<void> ptr_;
};

inline constexpr int kMaxValueDepth = 500;

struct SeqData {
  List items;
  size_t consumed = 0;
};
inline const List& Value::items() const { return static_cast<const SeqData*>(ptr_.get())->items; }
inline size_t& Value::consumed() const { return static_cast<SeqData*>(ptr_.get())->consumed; }

// An insertion-ordered dict with Python's key equality (1 == 1.0 == True).
// String keys are indexed; other keys are found by a scan.
struct Dict {
  struct StrHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::pair<Value, Value>> entries;
  std::unordered_map<std::string, size_t, StrHash, std::equal_to<>> index;  // string key -> entry

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value v);  // replaces in place or appends
  size_t size() const { return entries.size(); }
};

// Objects with attributes: namespace(), the loop variable, joiner().
struct Object {
  virtual ~Object() = default;
  virtual std::string_view type_name() const = 0;
  // The attribute, or an Undefined naming what was missing.
  virtual Value attr(std::string_view name) const = 0;
  virtual std::string repr(int depth) const;
};

// namespace(...): the one mutable value.
struct Namespace final : Object {
  Dict attrs;
  std::string_view type_name() const override { return "Namespace"; }
  Value attr(std::string_view name) const override;
  std::string repr(int depth) const override;
};

class Interp;
// Arguments of a call: positional, then keyword in the order written.
struct Args {
  List pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(std::string_view name) const;
};

// Macros, globals (range, namespace, raise_exception, ...) and bound methods.
struct Function {
  std::string name;
  std::function<Value(Interp&, Args&)> call;
};

// Python equality (==), including 1 == 1.0 and Undefined == Undefined.
bool py_equal(const Value& a, const Value& b);
// Python ordering (<); raises TypeError for unorderable pairs.
bool py_less(const Value& a, const Value& b);
// str(v) and repr(v) as Python prints them (floats shortest, strings quoted).
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
void append_repr(const Value& v, std::string& out, int depth = 0);
std::string float_repr(double d);
// Checked int64 arithmetic: Python ints do not overflow, so running past
// int64 is an error here rather than a wrong number.
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);

}  // namespace kvant::jinja
