// Tuning tables: parsing, matching, resolution (src/ops/tuning.h, docs/TUNING.md).
#include "ops/tuning.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <map>
#include <set>
#include <vector>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "mhccl/error.h"

#ifndef MHCCL_VERSION_STRING
#define MHCCL_VERSION_STRING "0.0.0"
#endif

namespace mhccl::tuning {

extern const char kBuiltinTableJson[];  // generated from src/ops/tuning_builtin.json (CMakeLists.txt)

namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& path, const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument,
              "tuning table " + path + ": " + where + ": " + what + " (docs/TUNING.md describes the format)");
}

std::string type_name(const json& v) { return v.is_null() ? "null" : v.type_name(); }

// Refuses a member of object `o` not among `names` (a misspelt one would otherwise be ignored):
// bad() at `where`.member (the member alone where `where` is empty) with `what`.
void only_members(const std::string& path, const json& o, const std::string& where,
                  std::initializer_list<const char*> names, const std::string& what) {
  for (auto it = o.begin(); it != o.end(); ++it) {
    if (std::find(names.begin(), names.end(), it.key()) == names.end()) {
      bad(path, where.empty() ? it.key() : where + "." + it.key(), what);
    }
  }
}

// A wrong value as an error message shows it: a scalar as JSON (a string cut at 64 bytes), an
// array or object by its size. Never the whole value: its serializer recurses (a deeply nested
// array overflowed the stack) and a large one would make the message as large.
std::string shown(const json& v) {
  if (v.is_array()) return "(an array of " + std::to_string(v.size()) + " elements)";
  if (v.is_object()) return "(an object of " + std::to_string(v.size()) + " members)";
  std::string d = v.dump();
  if (d.size() > 64) d = d.substr(0, 64) + "...";
  return d;
}

// "got ..." of a wrong value: its type and the value ("string \"1\""), or "null".
std::string got(const json& v) { return v.is_null() ? "null" : type_name(v) + " " + shown(v); }

// Line and column (1-based) of byte `offset` of `text`.
std::string place_of(const std::string& text, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

struct Reader {
  const std::string& path;

  const json& member(const json& obj, const char* name, const std::string& where) const {
    if (!obj.contains(name)) bad(path, where, std::string("expected a member \"") + name + "\"");
    return obj.at(name);
  }
  // An integer in [lo, hi].
  int64_t integer(const json& v, const std::string& where, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) bad(path, where, "expected an integer, got " + got(v));
    const bool beyond = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
    const int64_t x = beyond ? 0 : v.get<int64_t>();
    if (beyond || x < lo || x > hi) {
      bad(path, where, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + shown(v));
    }
    return x;
  }
  std::string string(const json& v, const std::string& where) const {
    if (!v.is_string()) bad(path, where, "expected a string, got " + got(v));
    return v.get<std::string>();
  }
  // A row threshold: an integer >= 1 or "never".
  int64_t threshold(const json& v, const std::string& where) const {
    if (v.is_string() && v.get<std::string>() == "never") return kNever;
    if (!v.is_number_integer()) {
      bad(path, where, "expected a row count >= 1 or \"never\", got " + got(v));
    }
    return integer(v, where, 1, kNever);
  }
  template <class T, class F>
  std::optional<T> optional_key(const json& key, const char* name, const std::string& where, F&& read) const {
    if (!key.contains(name)) bad(path, where + "." + name, "expected a value or \"*\" (any)");
    const json& v = key.at(name);
    if (v.is_string() && v.get<std::string>() == "*") return std::nullopt;
    return read(v, where + "." + name);
  }
};

Entry read_entry(const Reader& r, const json& e, size_t i) {
  const std::string where = "entries[" + std::to_string(i) + "]";
  if (!e.is_object()) bad(r.path, where, "expected an object, got " + type_name(e));
  // The entry's members (a misspelt "lanch" was ignored, its shapes with it, and the entry used:
  // a review, 2026-12-05): what the loader reads, what mhccl-tune writes beside it
  // (docs/TUNING.md), and free text.
  only_members(r.path, e, where,
               {"key", "mhccl", "provenance", "source", "thresholds", "launch", "timings", "defaults", "score", "gain",
                "launch_timings", "guard", "note"},
               "unknown entry member (key, mhccl, provenance, source, thresholds, launch; mhccl-tune's timings, "
               "defaults, score, gain, launch_timings, guard; note)");
  Entry out;
  out.index = i;
  const json& key = r.member(e, "key", where);
  if (!key.is_object()) bad(r.path, where + ".key", "expected an object, got " + type_name(key));
  const std::string kw = where + ".key";
  // A member the key does not have (a misspelt "topk", "Hidden") would otherwise be ignored, and
  // the entry match every value of the member meant.
  only_members(r.path, key, kw, {"gpu", "sms", "p2p", "nccl", "tp", "hidden", "hc", "variant", "top_k"},
               "unknown key member (gpu, sms, p2p, nccl, tp, hidden, hc, variant, top_k)");
  auto str = [&](const json& v, const std::string& w) { return r.string(v, w); };
  auto num = [&](int64_t lo, int64_t hi) {
    return [&r, lo, hi](const json& v, const std::string& w) { return r.integer(v, w, lo, hi); };
  };
  out.gpu = r.optional_key<std::string>(key, "gpu", kw, str);
  out.sms = r.optional_key<int64_t>(key, "sms", kw, num(1, 1 << 20));
  out.p2p = r.optional_key<std::string>(key, "p2p", kw, str);
  out.nccl = r.optional_key<std::string>(key, "nccl", kw, str);
  out.tp = r.optional_key<int64_t>(key, "tp", kw, num(1, 8));
  out.hidden = r.optional_key<int64_t>(key, "hidden", kw, num(8, 32768));
  out.hc = r.optional_key<int64_t>(key, "hc", kw, num(1, 8));
  out.variant = r.optional_key<std::string>(key, "variant", kw, str);
  if (key.contains("top_k")) out.top_k = r.optional_key<int64_t>(key, "top_k", kw, num(1, 16));
  if (out.p2p && *out.p2p != "p2p" && *out.p2p != "none" && *out.p2p != "self" && *out.p2p != "direct") {
    bad(r.path, kw + ".p2p", "expected \"p2p\", \"none\", \"self\", \"direct\" or \"*\", got \"" + *out.p2p + "\"");
  }
  if (out.variant && *out.variant != "plain" && *out.variant != "mxfp8" && *out.variant != "residual_only" &&
      *out.variant != "fp8" && *out.variant != "fp8_ue8m0") {
    bad(r.path, kw + ".variant",
        "expected \"plain\", \"mxfp8\", \"residual_only\", \"fp8\", \"fp8_ue8m0\" or \"*\", got \"" + *out.variant + "\"");
  }
  if (e.contains("mhccl")) out.mhccl = r.string(e.at("mhccl"), where + ".mhccl");
  out.provenance = r.string(r.member(e, "provenance", where), where + ".provenance");
  if (out.provenance != "measured" && out.provenance != "extrapolated") {
    bad(r.path, where + ".provenance", "expected \"measured\" or \"extrapolated\", got \"" + out.provenance + "\"");
  }
  if (e.contains("source")) out.source = r.string(e.at("source"), where + ".source");
  const json& th = r.member(e, "thresholds", where);
  const std::string tw = where + ".thresholds";
  if (!th.is_object()) bad(r.path, tw, "expected an object, got " + type_name(th));
  for (auto it = th.begin(); it != th.end(); ++it) {
    const std::string w = tw + "." + it.key();
    Settings& s = out.settings;
    if (it.key() == "two_shot_min_rows") s.two_shot_min_rows = r.threshold(*it, w);
    else if (it.key() == "two_shot_min_finalize_rows") s.two_shot_min_finalize_rows = r.threshold(*it, w);
    else if (it.key() == "nccl_min_rows") s.nccl_min_rows = r.threshold(*it, w);
    else if (it.key() == "nccl_min_finalize_rows") s.nccl_min_finalize_rows = r.threshold(*it, w);
    else if (it.key() == "streaming_min_rows") s.streaming_min_rows = r.integer(*it, w, -1, std::numeric_limits<int32_t>::max());
    else bad(r.path, w, "unknown threshold (two_shot_min_rows, two_shot_min_finalize_rows, nccl_min_rows, "
                        "nccl_min_finalize_rows, streaming_min_rows)");
  }
  if (e.contains("launch")) {
    const json& l = e.at("launch");
    const std::string lw = where + ".launch";
    if (!l.is_object()) bad(r.path, lw, "expected an object, got " + type_name(l));
    for (auto it = l.begin(); it != l.end(); ++it) {
      const std::string w = lw + "." + it.key();
      Settings& s = out.settings;
      if (it.key() == "publisher_ctas") s.publisher_ctas = r.integer(*it, w, 1, 1024);
      else if (it.key() == "finalize_publisher_ctas") s.finalize_publisher_ctas = r.integer(*it, w, 1, 1024);
      else if (it.key() == "reducer_ctas") s.reducer_ctas = r.integer(*it, w, 1, 1024);
      else bad(r.path, w, "unknown launch shape (publisher_ctas, finalize_publisher_ctas, reducer_ctas)");
    }
  }
  if (e.contains("timings") && !e.at("timings").is_array()) {
    bad(r.path, where + ".timings", "expected an array, got " + type_name(e.at("timings")));
  }
  return out;
}

bool key_equal(const Entry& e, const Key& k) {
  return (!e.gpu || *e.gpu == k.gpu) && (!e.sms || *e.sms == k.sms) && (!e.p2p || *e.p2p == k.p2p) &&
         (!e.tp || *e.tp == k.tp) && (!e.hidden || *e.hidden == k.hidden) && (!e.hc || *e.hc == k.hc) &&
         (!e.variant || *e.variant == k.variant) && (!e.top_k || *e.top_k == k.top_k);
}

std::string threshold_text(int64_t v) { return v == kNever ? "never" : std::to_string(v); }

}  // namespace

const char* library_version() { return MHCCL_VERSION_STRING; }

std::string major_minor(const std::string& v) {
  const size_t a = v.find('.');
  if (a == std::string::npos) return v;
  const size_t b = v.find('.', a + 1);
  return b == std::string::npos ? v : v.substr(0, b);
}

std::string key_text(const Key& k) {
  return "gpu \"" + k.gpu + "\", sms " + std::to_string(k.sms) + ", p2p " + k.p2p + ", nccl " + k.nccl + ", tp " +
         std::to_string(k.tp) + ", hidden " + std::to_string(k.hidden) + ", hc " + std::to_string(k.hc) +
         ", variant " + k.variant + ", top_k " + std::to_string(k.top_k);
}

std::string variant_key(const AllReduceMHCConfig& c) {
  if (c.quantize_layer_input) return "mxfp8";
  if (c.quantize_layer_input_fp8) return c.fp8_ue8m0_scales ? "fp8_ue8m0" : "fp8";
  return c.residual_only ? "residual_only" : "plain";
}

std::string p2p_key(int tp, bool reachable, bool lamport_self_test) {
  if (tp == 1) return lamport_self_test ? "self" : "direct";
  return reachable ? "p2p" : "none";
}

int Entry::specificity() const {
  return int(gpu.has_value()) + sms.has_value() + p2p.has_value() + nccl.has_value() + tp.has_value() +
         hidden.has_value() + hc.has_value() + variant.has_value() + top_k.has_value();
}

Table parse_table(const std::string& text, const std::string& path) {
  json doc;
  // A member given twice in one object: JSON leaves it to the reader, and the last one would win
  // silently (hiding a wrong value before it). The callback keeps the names of each object being
  // parsed, innermost last.
  std::vector<std::set<std::string>> names;
  std::string twice;
  const json::parser_callback_t note_names = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      names.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!names.empty()) names.pop_back();
    } else if (ev == json::parse_event_t::key && !names.empty() && twice.empty() &&
               !names.back().insert(parsed.get<std::string>()).second) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  // A NUL byte ends the text for the parser (what followed it was never read: a review,
  // 2026-12-05); no JSON holds one outside a string, where it is written \u0000.
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    bad(path, place_of(text, nul), "not valid JSON (a NUL byte)");
  }
  try {
    doc = json::parse(text, note_names);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    const size_t p = what.find("syntax error");
    bad(path, place_of(text, e.byte == 0 ? 0 : e.byte - 1), "not valid JSON (" + (p == std::string::npos ? what : what.substr(p)) + ")");
  } catch (const json::exception& e) {  // a number beyond double's range (1e400), say: no place known
    std::string what = e.what();
    const size_t p = what.find("] ");
    bad(path, "the document", "not a JSON this reader can hold (" + (p == std::string::npos ? what : what.substr(p + 2)) + ")");
  }
  if (!twice.empty()) {
    bad(path, "the document", "the member " + json(twice).dump() + " appears twice in one object");
  }
  const Reader r{path};
  if (!doc.is_object()) bad(path, "the document", "expected a JSON object, got " + type_name(doc));
  Table t;
  t.path = path;
  // The version first: a table of another version is stale as a whole, whatever else its
  // document holds (members, or a generator's type, that this version does not know).
  t.schema_version = static_cast<int>(r.integer(r.member(doc, "schema_version", "the document"), "schema_version", 0, 1 << 30));
  if (t.schema_version != kSchemaVersion) {
    if (doc.contains("generator") && doc.at("generator").is_string()) t.generator = doc.at("generator").get<std::string>();
    return t;  // stale: its entries may mean something else
  }
  only_members(path, doc, "", {"schema_version", "generator", "created", "command", "note", "entries"},
               "unknown member of the document (schema_version, generator, created, command, note, entries)");
  if (doc.contains("generator")) t.generator = r.string(doc.at("generator"), "generator");
  const json& entries = r.member(doc, "entries", "the document");
  if (!entries.is_array()) bad(path, "entries", "expected an array, got " + type_name(entries));
  for (size_t i = 0; i < entries.size(); ++i) t.entries.push_back(read_entry(r, entries[i], i));
  // Two entries of one key would make the choice depend on their order: refused. The key as
  // match() compares it: NCCL by major.minor (an entry of 2.28.3 and one of 2.28.9 both match a
  // process on 2.28.9, and the first would win).
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < t.entries.size(); ++i) {
    const Entry& a = t.entries[i];
    auto field = [](const auto& o) { return o ? json(*o) : json(nullptr); };
    const std::string canonical =
        json::array({field(a.gpu), field(a.sms), field(a.p2p),
                     a.nccl ? json(major_minor(*a.nccl)) : json(nullptr), field(a.tp), field(a.hidden), field(a.hc),
                     field(a.variant), field(a.top_k)})
            .dump();
    const auto [it, fresh] = seen.emplace(canonical, i);
    if (!fresh) {
      bad(path, "entries[" + std::to_string(i) + "].key",
          "the same key as entries[" + std::to_string(it->second) + "]" +
              (a.nccl ? " (NCCL is compared by major.minor: " + major_minor(*a.nccl) + ")" : std::string()));
    }
  }
  return t;
}

Table load_table(const std::string& path) {
  const std::string where = "AllReduceMHCConfig::tuning_file or MHCCL_TUNING_FILE";
  if (path.find('\0') != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                "tuning table: the path holds a NUL character (" + where + "; it would name another file)");
  }
  // A regular file of at most kMaxTableBytes, checked before it is opened: opening a FIFO for
  // reading waits for a writer without end, and a device (/dev/zero) never ends (a review,
  // 2026-12-05). A table is a few KiB.
  constexpr int64_t kMaxTableBytes = int64_t{16} << 20;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (!S_ISREG(st.st_mode) || st.st_size > kMaxTableBytes)) {
    throw Error(ErrorCode::kInvalidArgument,
                "tuning table " + path + ": " +
                    (S_ISREG(st.st_mode) ? "larger than " + std::to_string(kMaxTableBytes >> 20) + " MiB (" +
                                               std::to_string(static_cast<int64_t>(st.st_size)) + " bytes)"
                                         : std::string("not a regular file")) +
                    " (" + where + "; a table mhccl-tune writes is a few KiB)");
  }
  // stdio, not iostreams (src/common/text.h says why).
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  int why = errno;
  std::string text;
  bool read = f != nullptr;
  if (f != nullptr) {
    // At most one byte beyond the limit: a file whose size says 0 may never end
    // (/proc/self/pagemap; a review, 2026-12-05), as a device does.
    char buf[4096];
    for (size_t n; text.size() <= static_cast<size_t>(kMaxTableBytes) && (n = std::fread(buf, 1, sizeof buf, f)) > 0;) {
      text.append(buf, n);
    }
    read = std::ferror(f) == 0;
    why = errno;  // EISDIR for a directory
    std::fclose(f);
  }
  if (!read) {
    throw Error(ErrorCode::kInvalidArgument,
                "tuning table " + path + ": cannot be read (" + std::strerror(why) + "; " + where + ")");
  }
  if (text.size() > static_cast<size_t>(kMaxTableBytes)) {
    throw Error(ErrorCode::kInvalidArgument, "tuning table " + path + ": larger than " +
                                                 std::to_string(kMaxTableBytes >> 20) + " MiB (" + where +
                                                 "; a table mhccl-tune writes is a few KiB)");
  }
  return parse_table(text, path);
}

const Table& builtin_table() {
  static const Table t = parse_table(kBuiltinTableJson, "built-in");
  return t;
}

Match match(const Table& table, const Key& key) {
  Match m;
  if (table.schema_version != kSchemaVersion) {
    m.why = "stale: schema_version " + std::to_string(table.schema_version) + ", this mhccl reads " +
            std::to_string(kSchemaVersion) + " (run mhccl-tune again)";
    return m;
  }
  std::string stale;
  for (const Entry& e : table.entries) {
    if (!key_equal(e, key)) continue;
    if (e.nccl && major_minor(*e.nccl) != major_minor(key.nccl)) {
      if (stale.empty()) {
        stale = "stale: entries[" + std::to_string(e.index) + "] was measured with NCCL " + *e.nccl +
                ", this process loaded " + key.nccl + " (another major.minor; run mhccl-tune again)";
      }
      continue;
    }
    if (e.mhccl && !key.mhccl.empty() && major_minor(*e.mhccl) != major_minor(key.mhccl)) {
      if (stale.empty()) {
        stale = "stale: entries[" + std::to_string(e.index) + "] was measured by mhccl " + *e.mhccl + ", this is " +
                key.mhccl + " (another major.minor; run mhccl-tune again)";
      }
      continue;
    }
    if (m.entry == nullptr || e.specificity() > m.entry->specificity()) m.entry = &e;
  }
  if (m.entry == nullptr) m.why = stale.empty() ? "no entry for " + key_text(key) : stale;
  return m;
}

int64_t default_two_shot_min_rows(int tp, bool finalize) {
  Key k;
  k.tp = tp;
  const Match m = match(builtin_table(), k);
  if (m.entry == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "built-in tuning table (internal): " + m.why);
  }
  const Settings& s = m.entry->settings;
  return *(finalize ? s.two_shot_min_finalize_rows : s.two_shot_min_rows);
}

Resolved resolve(const AllReduceMHCConfig& config, const Key& key, const EnvOverrides& env, const Table* table) {
  Resolved r;
  r.cfg = config;
  const Match builtin = match(builtin_table(), key);
  if (builtin.entry == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "built-in tuning table (internal): " + builtin.why);
  }
  const Settings& b = builtin.entry->settings;
  const Entry* user = nullptr;
  std::string why;
  if (table != nullptr) {
    const Match m = match(*table, key);
    user = m.entry;
    why = m.why;
  }
  const Settings none;
  const Settings& u = user ? user->settings : none;
  // Level 2 (explicit), then 3 (the caller's table), then 4 (built-in).
  auto pick = [](int64_t explicit_value, bool is_explicit, const std::optional<int64_t>& table_value,
                 const std::optional<int64_t>& builtin_value, int64_t fallback) {
    if (is_explicit) return explicit_value;
    if (table_value) return *table_value;
    return builtin_value ? *builtin_value : fallback;
  };
  AllReduceMHCConfig& c = r.cfg;
  c.two_shot_min_rows = pick(c.two_shot_min_rows, c.two_shot_min_rows != 0, u.two_shot_min_rows, b.two_shot_min_rows, kNever);
  c.two_shot_min_finalize_rows = pick(c.two_shot_min_finalize_rows, c.two_shot_min_finalize_rows != 0,
                                      u.two_shot_min_finalize_rows, b.two_shot_min_finalize_rows, kNever);
  c.nccl_min_rows = pick(c.nccl_min_rows, c.nccl_min_rows != 0, u.nccl_min_rows, b.nccl_min_rows, kNever);
  c.nccl_min_finalize_rows = pick(c.nccl_min_finalize_rows, c.nccl_min_finalize_rows != 0, u.nccl_min_finalize_rows,
                                  b.nccl_min_finalize_rows, kNever);
  c.streaming_min_rows = pick(c.streaming_min_rows, c.streaming_min_rows != -1, u.streaming_min_rows,
                              b.streaming_min_rows, -1);
  r.publisher_ctas[0] = static_cast<int>(pick(0, false, u.publisher_ctas, b.publisher_ctas, 24));
  r.publisher_ctas[1] = static_cast<int>(pick(0, false, u.finalize_publisher_ctas, b.finalize_publisher_ctas, 64));
  r.reducer_ctas = static_cast<int>(pick(0, false, u.reducer_ctas, b.reducer_ctas, 16));
  // Level 1: the benchmark sweeps' variables.
  if (env.ctas_per_row) r.ctas_per_row = static_cast<int>(*env.ctas_per_row);
  if (env.streaming_min_rows) c.streaming_min_rows = *env.streaming_min_rows;
  if (env.publisher_ctas) r.publisher_ctas[0] = r.publisher_ctas[1] = static_cast<int>(*env.publisher_ctas);
  if (env.reducer_ctas) r.reducer_ctas = static_cast<int>(*env.reducer_ctas);
  const std::string builtin_text = "built-in defaults (TP=" + std::to_string(key.tp) + ": " + builtin.entry->provenance + ")";
  if (user != nullptr) {
    r.table_used = true;
    r.source = "tuning table " + table->path + " entries[" + std::to_string(user->index) + "] (" + user->provenance +
               ") for " + key_text(key) + "; values it does not set: " + builtin_text;
  } else if (table != nullptr) {
    r.source = "tuning table " + table->path + ": " + why + "; using the " + builtin_text;
  } else {
    r.source = builtin_text;
  }
  r.source += "; two-shot from " + threshold_text(c.two_shot_min_rows) + " (finalize " +
              threshold_text(c.two_shot_min_finalize_rows) + "), NCCL from " + threshold_text(c.nccl_min_rows) +
              " (finalize " + threshold_text(c.nccl_min_finalize_rows) + "), streaming_min_rows " +
              std::to_string(c.streaming_min_rows) + ", publishers " + std::to_string(r.publisher_ctas[0]) + "/" +
              std::to_string(r.publisher_ctas[1]) + ", reducers " + std::to_string(r.reducer_ctas) +
              " (explicit config values and MHCCL_* launch-shape variables win over tables)";
  return r;
}

std::vector<std::pair<const char*, int64_t>> agreement_fields(const Resolved& r, bool force_nccl_fallback) {
  const AllReduceMHCConfig& cfg = r.cfg;
  return {{"hidden_size", cfg.hidden_size},
          {"hc_mult", cfg.hc_mult},
          {"max_num_tokens", cfg.max_num_tokens},
          {"top_k", cfg.top_k},
          {"quantize_layer_input", cfg.quantize_layer_input},
          {"quantize_layer_input_fp8", cfg.quantize_layer_input_fp8},
          {"fp8_ue8m0_scales", cfg.fp8_ue8m0_scales},
          {"residual_only", cfg.residual_only},
          {"two_shot_min_rows (config or tuning table)", cfg.two_shot_min_rows},
          {"two_shot_min_finalize_rows (config or tuning table)", cfg.two_shot_min_finalize_rows},
          {"nccl_min_rows (config or tuning table)", cfg.nccl_min_rows},
          {"nccl_min_finalize_rows (config or tuning table)", cfg.nccl_min_finalize_rows},
          {"enable_pdl", cfg.enable_pdl},
          {"single_launch_max_rows", cfg.single_launch_max_rows},
          {"streaming_min_rows (config, tuning table or MHCCL_STREAMING_MIN_ROWS)", cfg.streaming_min_rows},
          {"lamport_self_test", cfg.lamport_self_test},
          {"lamport_self_test_auto", cfg.lamport_self_test_auto},
          {"MHCCL_CTAS_PER_ROW", r.ctas_per_row},
          {"publisher CTAs of call (tuning table or MHCCL_STREAM_PUBLISHERS)", r.publisher_ctas[0]},
          {"publisher CTAs of finalize (tuning table or MHCCL_STREAM_PUBLISHERS)", r.publisher_ctas[1]},
          {"reducer CTAs (tuning table or MHCCL_STREAM_REDUCERS)", r.reducer_ctas},
          {"force_nccl_fallback", force_nccl_fallback}};
}

}  // namespace mhccl::tuning
