// jinja2's built-in filters on data and sequences (filters.py) with their
// Python semantics, and transformers' tojson (json.dumps with
// ensure_ascii=False). Results that are generators in jinja2 (map, select,
// unique, items, ...) are generators here too: true even when empty, no
// len() and no indexing until |list.
#include "tokenizer/jinja_filters.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <unordered_map>

namespace kvant::jinja {
namespace {

// ---- filters ----

Value f_tojson(Interp& in, const Value& v, Args& a) {
  Params p(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonStyle st;
  st.ensure_ascii = p.flag(0);
  const Value indent = p.get(1, Value::none());
  if (!indent.is_none()) {
    st.has_indent = true;
    st.indent = indent.is_string()
                    ? indent.str()
                    : std::string(size_t(std::max<int64_t>(0, indent.to_int())), ' ');
    st.item_sep = ",";
  }
  const Value seps = p.get(2, Value::none());
  if (!seps.is_none()) {
    const Value s = in.iterate(seps);
    if (s.items().size() != 2 || !s.items()[0].is_string() || !s.items()[1].is_string())
      raise("separators must be a pair of strings");
    st.item_sep = s.items()[0].str();
    st.key_sep = s.items()[1].str();
  }
  st.sort_keys = p.flag(3);
  std::string out;
  dump_json(v, st, out);
  return str_value(in, std::move(out));
}

Value f_default(Interp&, const Value& v, Args& a) {
  Params p(a, {"default_value", "boolean"}, "default");
  if (v.is_undefined() || (p.flag(1) && !v.truthy())) return p.get(0, Value::string(""));
  return v;
}

Value f_length(Interp& in, const Value& v, Args& a) {
  Params p(a, {}, "length");
  return Value::integer(in.length(v));
}

Value f_string(Interp&, const Value& v, Args& a) {
  Params p(a, {}, "string");
  return v.is_string() ? v : Value::string(py_str(v));
}

Value f_trim(Interp& in, const Value& v, Args& a) {
  Params p(a, {"chars"}, "trim");
  const std::string s = soft_str(v);
  const Value chars = p.get(0, Value::none());
  if (chars.is_none()) return str_value(in, std::string(py_strip(s, true, true)));
  return str_value(in, std::string(py_strip_chars(s, soft_str(chars), true, true)));
}

Value f_case(Interp& in, const Value& v, Args& a, std::string (*fn)(std::string_view),
             const char* name) {
  Params p(a, {}, name);
  return str_value(in, fn(soft_str(v)));
}
Value f_upper(Interp& in, const Value& v, Args& a) { return f_case(in, v, a, py_upper, "upper"); }
Value f_lower(Interp& in, const Value& v, Args& a) { return f_case(in, v, a, py_lower, "lower"); }
Value f_title(Interp& in, const Value& v, Args& a) {
  return f_case(in, v, a, jinja_title, "title");
}
Value f_capitalize(Interp& in, const Value& v, Args& a) {
  return f_case(in, v, a, py_capitalize, "capitalize");
}

Value f_replace(Interp& in, const Value& v, Args& a) {
  Params p(a, {"old", "new", "count"}, "replace");
  if (!p.has(0) || !p.has(1)) raise("replace() missing required argument");
  return str_value(in, py_replace(soft_str(v), soft_str(p.get(0, {})), soft_str(p.get(1, {})),
                                  p.integer(2, -1)));
}

Value f_join(Interp& in, const Value& v, Args& a) {
  Params p(a, {"d", "attribute"}, "join");
  const std::string sep = soft_str(p.get(0, Value::string("")));
  const Value items = in.iterate(v);
  const Value attribute = p.get(1, Value::none());
  std::string out;
  bool first = true;
  for (const Value& x : items.items()) {
    if (!first) out += sep;
    first = false;
    out += soft_str(attribute.is_none() ? x : attr_path(in, x, attribute));
    in.check_size(out.size());
  }
  return str_value(in, std::move(out));
}

Value f_first(Interp& in, const Value& v, Args& a) {
  Params p(a, {}, "first");
  if (v.is_seq() && v.kind() == SeqKind::Generator) {  // takes one item
    size_t& taken = v.consumed();
    if (taken >= v.items().size()) return Value::undefined("No first item, sequence was empty.");
    return v.items()[taken++];
  }
  const Value xs = in.iterate(v);
  return xs.items().empty() ? Value::undefined("No first item, sequence was empty.")
                            : xs.items()[0];
}

Value f_last(Interp& in, const Value& v, Args& a) {
  Params p(a, {}, "last");
  if (v.is_seq() && v.kind() == SeqKind::Generator) raise("'generator' object is not reversible");
  const Value xs = in.iterate(v);
  return xs.items().empty() ? Value::undefined("No last item, sequence was empty.")
                            : xs.items().back();
}

Value f_list(Interp& in, const Value& v, Args& a) {
  Params p(a, {}, "list");
  return Value::seq(in.iterate(v).items());
}

Value f_reverse(Interp& in, const Value& v, Args& a) {
  Params p(a, {}, "reverse");
  if (v.is_string()) {
    auto cps = code_points(v.str());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return str_value(in, std::move(out));
  }
  List xs = in.iterate(v).items();
  std::reverse(xs.begin(), xs.end());
  // reversed() of a list is an iterator; a generator is turned into a list.
  return Value::seq(std::move(xs), v.is_seq() && v.kind() == SeqKind::Generator
                                       ? SeqKind::List
                                       : SeqKind::Generator);
}

Value f_items(Interp& in, const Value& v, Args& a) {
  Params p(a, {}, "items");
  if (v.is_undefined()) return generator({});
  if (!v.is_dict()) raise("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.dict().entries) out.push_back(Value::seq({k, x}, SeqKind::Tuple));
  in.charge(out.size() / 16);
  return generator(std::move(out));
}

Value f_dictsort(Interp& in, const Value& v, Args& a) {
  Params p(a, {"case_sensitive", "by", "reverse"}, "dictsort");
  if (!v.is_dict()) raise("'" + std::string(v.type_name()) + "' object has no attribute 'items'");
  const Value by = p.get(1, Value::string("key"));
  if (!by.is_string() || (by.str() != "key" && by.str() != "value"))
    raise("You can only sort by either \"key\" or \"value\"");
  const size_t pos = by.str() == "key" ? 0 : 1;
  List out;
  for (const auto& [k, x] : v.dict().entries) out.push_back(Value::seq({k, x}, SeqKind::Tuple));
  const bool cs = p.flag(0), rev = p.flag(2);
  auto key = [&](const Value& t) { return cs ? t.items()[pos] : ignore_case(t.items()[pos]); };
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    return rev ? py_less(key(y), key(x)) : py_less(key(x), key(y));
  });
  in.charge(out.size() / 16);
  return Value::seq(std::move(out));
}

Value f_sort(Interp& in, const Value& v, Args& a) {
  Params p(a, {"reverse", "case_sensitive", "attribute"}, "sort");
  List xs = in.iterate(v).items();
  const bool rev = p.flag(0), cs = p.flag(1);
  std::vector<Value> attrs;  // "a,b" sorts by a then b
  const Value attribute = p.get(2, Value::none());
  if (attribute.is_string()) {
    for (const std::string& s : py_split(attribute.str(), Value::string(","), -1))
      attrs.push_back(Value::string(s));
  } else if (!attribute.is_none()) {
    attrs.push_back(attribute);
  }
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t i = 0; i < xs.size(); ++i) {
    List k;
    if (attrs.empty()) k.push_back(cs ? xs[i] : ignore_case(xs[i]));
    for (const Value& at : attrs) {
      const Value x = attr_path(in, xs[i], at);
      k.push_back(cs ? x : ignore_case(x));
    }
    keyed.emplace_back(Value::seq(std::move(k)), i);
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? py_less(y.first, x.first) : py_less(x.first, y.first);
  });
  List out;
  for (const auto& kv : keyed) out.push_back(xs[kv.second]);
  in.charge(out.size() / 4);
  return Value::seq(std::move(out));
}

Value f_unique(Interp& in, const Value& v, Args& a) {
  Params p(a, {"case_sensitive", "attribute"}, "unique");
  const bool cs = p.flag(0);
  const Value attribute = p.get(1, Value::none());
  List out, seen;
  const Value seq_v = in.iterate(v);
  for (const Value& x : seq_v.items()) {
    Value k = attribute.is_none() ? x : attr_path(in, x, attribute);
    if (!cs) k = ignore_case(k);
    if (k.is_seq() || k.is_dict()) raise("unhashable type: '" + std::string(k.type_name()) + "'");
    in.charge(seen.size() / 16 + 1);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, k); }))
      continue;
    seen.push_back(k);
    out.push_back(x);
  }
  return generator(std::move(out));
}

Value min_max(Interp& in, const Value& v, Args& a, bool is_max) {
  Params p(a, {"case_sensitive", "attribute"}, is_max ? "max" : "min");
  const Value seq_v = in.iterate(v);
  const List& xs = seq_v.items();
  if (xs.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value attribute = p.get(1, Value::none());
  auto key = [&](const Value& x) {
    Value k = attribute.is_none() ? x : attr_path(in, x, attribute);
    return p.flag(0) ? k : ignore_case(k);
  };
  size_t best = 0;
  Value best_key = key(xs[0]);
  for (size_t i = 1; i < xs.size(); ++i) {
    Value k = key(xs[i]);
    if (is_max ? py_less(best_key, k) : py_less(k, best_key)) best = i, best_key = std::move(k);
  }
  return xs[best];
}
Value f_max(Interp& in, const Value& v, Args& a) { return min_max(in, v, a, true); }
Value f_min(Interp& in, const Value& v, Args& a) { return min_max(in, v, a, false); }

Value f_sum(Interp& in, const Value& v, Args& a) {
  Params p(a, {"attribute", "start"}, "sum");
  Value total = p.get(1, Value::integer(0));
  const Value attribute = p.get(0, Value::none());
  const Value seq_v = in.iterate(v);
  for (const Value& x : seq_v.items()) {
    if (x.is_string()) raise("unsupported operand type(s) for +: 'int' and 'str'");
    total = in.binop(BinOp::Add, total, attribute.is_none() ? x : attr_path(in, x, attribute));
  }
  return total;
}

Value f_map(Interp& in, const Value& v, Args& a) {
  List out;
  if (!v.truthy()) return generator({});  // jinja2: `if value:` first
  const Value seq_v = in.iterate(v);
  const List& xs = seq_v.items();
  if (a.pos.empty() && a.kwarg("attribute")) {
    const Value attribute = *a.kwarg("attribute");
    const Value* dflt = a.kwarg("default");
    for (const auto& [k, x] : a.kw)
      if (k != "attribute" && k != "default") raise("Unexpected keyword argument '" + k + "'");
    for (const Value& x : xs) {
      Value y = attr_path(in, x, attribute);
      out.push_back(y.is_undefined() && dflt && !dflt->is_none() ? *dflt : y);
    }
    return generator(std::move(out));
  }
  if (a.pos.empty()) raise("map requires a filter argument");
  const std::string name = soft_str(a.pos[0]);
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& x : xs) {
    Args each = rest;
    out.push_back(in.apply_filter(name, x, each));
  }
  return generator(std::move(out));
}

// select / reject / selectattr / rejectattr.
Value select_impl(Interp& in, const Value& v, Args& a, bool keep, bool by_attr) {
  if (!v.truthy()) return generator({});
  size_t off = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) raise("Missing parameter for attribute name");
    attribute = a.pos[0];
    off = 1;
  }
  const bool has_test = a.pos.size() > off;
  const std::string test = has_test ? soft_str(a.pos[off]) : "";
  Args rest;
  if (has_test) rest.pos.assign(a.pos.begin() + long(off) + 1, a.pos.end());
  rest.kw = a.kw;
  List out;
  const Value seq_v = in.iterate(v);
  for (const Value& x : seq_v.items()) {
    const Value y = by_attr ? attr_path(in, x, attribute) : x;
    Args each = rest;
    const bool t = has_test ? in.apply_test(test, y, each) : y.truthy();
    if (t == keep) out.push_back(x);
  }
  return generator(std::move(out));
}
Value f_select(Interp& in, const Value& v, Args& a) { return select_impl(in, v, a, true, false); }
Value f_reject(Interp& in, const Value& v, Args& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, Args& a) {
  return select_impl(in, v, a, true, true);
}
Value f_rejectattr(Interp& in, const Value& v, Args& a) {
  return select_impl(in, v, a, false, true);
}

}  // namespace

void add_sequence_filters(FilterTable& t) {
  t["tojson"] = f_tojson;
  t["default"] = t["d"] = f_default;
  t["length"] = t["count"] = f_length;
  t["string"] = f_string;
  t["trim"] = f_trim;
  t["upper"] = f_upper;
  t["lower"] = f_lower;
  t["title"] = f_title;
  t["capitalize"] = f_capitalize;
  t["replace"] = f_replace;
  t["join"] = f_join;
  t["first"] = f_first;
  t["last"] = f_last;
  t["list"] = f_list;
  t["reverse"] = f_reverse;
  t["items"] = f_items;
  t["dictsort"] = f_dictsort;
  t["sort"] = f_sort;
  t["unique"] = f_unique;
  t["max"] = f_max;
  t["min"] = f_min;
  t["sum"] = f_sum;
  t["map"] = f_map;
  t["select"] = f_select;
  t["reject"] = f_reject;
  t["selectattr"] = f_selectattr;
  t["rejectattr"] = f_rejectattr;
}

}  // namespace kvant::jinja
