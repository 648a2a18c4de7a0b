// Tuning tables (src/ops/tuning.h, docs/TUNING.md): the built-in table gives the defaults the
// library had before tables existed; parsing, schema and version errors, malformed files (the
// error names the file and the place), matching and staleness, the precedence (explicit config
// and the launch-shape variables over the table), and the configuration agreement of the
// table-derived fields over 2-8 modelled ranks.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/communicator_impl.h"
#include "mhccl/error.h"
#include "ops/tuning.h"
#include "tune/table.h"

namespace mhccl {
namespace {

using tuning::kNever;

// The default function as it was before the built-in table (src/ops/all_reduce_mhc.cpp at
// a3b59db), for the equality test below.
int64_t old_default_two_shot_min_rows(int tp, bool finalize) {
  switch (tp) {
    case 1: return kNever;
    case 2: return finalize ? kNever : 2048;
    case 4: return finalize ? 512 : 384;
    default: return finalize ? 256 : 192;
  }
}

tuning::Key h200_key(int tp = 2, const std::string& variant = "plain") {
  tuning::Key k;
  k.gpu = "NVIDIA H200";
  k.sms = 132;
  k.p2p = tp == 1 ? "self" : "p2p";
  k.nccl = "2.28.9";
  k.tp = tp;
  k.hidden = 5120;
  k.hc = 4;
  k.variant = variant;
  k.top_k = 6;
  k.mhccl = tuning::library_version();
  return k;
}

// One entry's JSON for h200_key(tp), with the given thresholds object.
std::string entry_json(int tp, const std::string& thresholds, const std::string& variant = "plain",
                       const std::string& nccl = "2.28.3", const std::string& extra = "") {
  return R"({"key": {"gpu": "NVIDIA H200", "sms": 132, "p2p": ")" + std::string(tp == 1 ? "self" : "p2p") +
         R"(", "nccl": ")" + nccl + R"(", "tp": )" + std::to_string(tp) +
         R"(, "hidden": 5120, "hc": 4, "variant": ")" + variant + R"("}, "provenance": "measured", )" + extra +
         R"("thresholds": )" + thresholds + R"(, "timings": []})";
}

std::string table_json(const std::vector<std::string>& entries, int schema = 1) {
  std::string s = R"({"schema_version": )" + std::to_string(schema) + R"(, "generator": "test", "entries": [)";
  for (size_t i = 0; i < entries.size(); ++i) s += (i ? ",\n" : "\n") + entries[i];
  return s + "\n]}\n";
}

// The Error a call throws: its code and message.
std::pair<ErrorCode, std::string> error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {ErrorCode::kInvalidArgument, "(no error)"};
}

void expect_bad_table(const std::string& text, const std::vector<std::string>& parts) {
  const auto [code, msg] = error_of([&] { tuning::parse_table(text, "/etc/mhccl/tune.json"); });
  EXPECT_EQ(code, ErrorCode::kInvalidArgument) << msg;
  EXPECT_NE(msg.find("tuning table /etc/mhccl/tune.json: "), std::string::npos) << msg;
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "want '" << p << "' in: " << msg;
}

AllReduceMHCConfig dsv41(int64_t capacity = 4096) {
  AllReduceMHCConfig c;
  c.max_num_tokens = capacity;
  return c;
}

// --- The built-in table ---------------------------------------------------------------------

TEST(TuningBuiltin, DefaultsEqualTheOldFunctionsForEveryTpHiddenAndVariant) {
  const tuning::Table& t = tuning::builtin_table();
  EXPECT_EQ(t.schema_version, tuning::kSchemaVersion);
  EXPECT_EQ(t.path, "built-in");
  for (const int tp : {1, 2, 4, 8}) {
    for (const bool fin : {false, true}) {
      EXPECT_EQ(tuning::default_two_shot_min_rows(tp, fin), old_default_two_shot_min_rows(tp, fin))
          << "tp=" << tp << " finalize=" << fin;
    }
    for (const int64_t h : {int64_t{8}, int64_t{1024}, int64_t{4096}, int64_t{5120}, int64_t{7168}, int64_t{8192}, int64_t{32768}}) {
      for (const int hc : {1, 2, 4, 8}) {
        for (const char* variant : {"plain", "mxfp8", "residual_only", "fp8", "fp8_ue8m0"}) {
          tuning::Key k = h200_key(tp, variant);
          k.hidden = h;
          k.hc = hc;
          k.gpu = "any GPU";
          const tuning::Resolved r = tuning::resolve(dsv41(), k, {}, nullptr);
          const std::string where = "tp=" + std::to_string(tp) + " H=" + std::to_string(h) + " hc=" +
                                    std::to_string(hc) + " " + variant;
          EXPECT_EQ(r.cfg.two_shot_min_rows, old_default_two_shot_min_rows(tp, false)) << where;
          EXPECT_EQ(r.cfg.two_shot_min_finalize_rows, old_default_two_shot_min_rows(tp, true)) << where;
          EXPECT_EQ(r.cfg.nccl_min_rows, kNever) << where;           // opt-in: never by default
          EXPECT_EQ(r.cfg.nccl_min_finalize_rows, kNever) << where;
          EXPECT_EQ(r.cfg.streaming_min_rows, -1) << where;          // automatic
          EXPECT_EQ(r.publisher_ctas[0], 24) << where;               // the built-in publisher CTAs
          EXPECT_EQ(r.publisher_ctas[1], 64) << where;               // ... of finalize
          EXPECT_EQ(r.reducer_ctas, 16) << where;                    // kDefaultReducerCtas
          EXPECT_EQ(r.ctas_per_row, 0) << where;
          EXPECT_FALSE(r.table_used);
        }
      }
    }
  }
}

TEST(TuningBuiltin, Tp2IsMeasuredTp4And8Extrapolated) {
  for (const int tp : {1, 2, 4, 8}) {
    const tuning::Match m = tuning::match(tuning::builtin_table(), h200_key(tp));
    ASSERT_NE(m.entry, nullptr) << m.why;
    EXPECT_EQ(m.entry->provenance, tp == 2 ? "measured" : "extrapolated") << "tp=" << tp;
    EXPECT_FALSE(m.entry->source.empty());
  }
}

// --- Parsing and its errors -------------------------------------------------------------------

TEST(TuningParse, ReadsEveryField) {
  const std::string text = table_json({entry_json(
      2, R"({"two_shot_min_rows": 1024, "two_shot_min_finalize_rows": "never", "nccl_min_rows": 4096,
             "nccl_min_finalize_rows": "never", "streaming_min_rows": 512})",
      "mxfp8", "2.28.3",
      R"("mhccl": "0.1.0", "source": "2 x H200, test", "launch": {"publisher_ctas": 24, "finalize_publisher_ctas": 48, "reducer_ctas": 8}, )")});
  const tuning::Table t = tuning::parse_table(text, "t.json");
  EXPECT_EQ(t.schema_version, 1);
  EXPECT_EQ(t.generator, "test");
  ASSERT_EQ(t.entries.size(), 1u);
  const tuning::Entry& e = t.entries[0];
  EXPECT_EQ(*e.gpu, "NVIDIA H200");
  EXPECT_EQ(*e.sms, 132);
  EXPECT_EQ(*e.p2p, "p2p");
  EXPECT_EQ(*e.nccl, "2.28.3");
  EXPECT_EQ(*e.tp, 2);
  EXPECT_EQ(*e.hidden, 5120);
  EXPECT_EQ(*e.hc, 4);
  EXPECT_EQ(*e.variant, "mxfp8");
  EXPECT_FALSE(e.top_k.has_value());  // absent: any
  EXPECT_EQ(*e.mhccl, "0.1.0");
  EXPECT_EQ(e.provenance, "measured");
  EXPECT_EQ(e.source, "2 x H200, test");
  EXPECT_EQ(*e.settings.two_shot_min_rows, 1024);
  EXPECT_EQ(*e.settings.two_shot_min_finalize_rows, kNever);
  EXPECT_EQ(*e.settings.nccl_min_rows, 4096);
  EXPECT_EQ(*e.settings.nccl_min_finalize_rows, kNever);
  EXPECT_EQ(*e.settings.streaming_min_rows, 512);
  EXPECT_EQ(*e.settings.publisher_ctas, 24);
  EXPECT_EQ(*e.settings.finalize_publisher_ctas, 48);
  EXPECT_EQ(*e.settings.reducer_ctas, 8);
  EXPECT_EQ(e.specificity(), 8);
}

TEST(TuningParse, WildcardsAndAbsentValues) {
  const std::string text = R"({"schema_version": 1, "entries": [
    {"key": {"gpu": "*", "sms": "*", "p2p": "*", "nccl": "*", "tp": 4, "hidden": "*", "hc": "*", "variant": "*"},
     "provenance": "extrapolated", "thresholds": {"two_shot_min_rows": 300}}]})";
  const tuning::Table t = tuning::parse_table(text, "t.json");
  ASSERT_EQ(t.entries.size(), 1u);
  EXPECT_EQ(t.entries[0].specificity(), 1);
  EXPECT_FALSE(t.entries[0].settings.two_shot_min_finalize_rows.has_value());
  EXPECT_FALSE(t.entries[0].settings.publisher_ctas.has_value());
}

TEST(TuningParse, SyntaxErrorNamesFileLineAndColumn) {
  expect_bad_table("{\"schema_version\": 1,\n  \"entries\": [\n    {\"key\": }\n]}", {"line 3, column 13", "not valid JSON"});
  expect_bad_table("", {"line 1, column 1", "not valid JSON"});
}

TEST(TuningParse, WrongTypesAndValuesNameThePlace) {
  const std::string good = R"({"two_shot_min_rows": 1024})";
  expect_bad_table(R"([1, 2])", {"the document", "expected a JSON object"});
  expect_bad_table(R"({"entries": []})", {"expected a member \"schema_version\""});
  expect_bad_table(R"({"schema_version": "1", "entries": []})", {"schema_version", "expected an integer"});
  expect_bad_table(R"({"schema_version": 1})", {"expected a member \"entries\""});
  expect_bad_table(R"({"schema_version": 1, "entries": {}})", {"entries: expected an array"});
  expect_bad_table(table_json({"3"}), {"entries[0]: expected an object"});
  expect_bad_table(table_json({entry_json(2, good), entry_json(2, R"({"two_shot_min_rows": 0})", "mxfp8")}),
                   {"entries[1].thresholds.two_shot_min_rows", "expected an integer in [1, "});
  expect_bad_table(table_json({entry_json(2, R"({"two_shot_min_rows": "sometimes"})")}),
                   {"entries[0].thresholds.two_shot_min_rows", "\"never\"", "sometimes"});
  expect_bad_table(table_json({entry_json(2, R"({"two_shot_min_rows": 1.5})")}),
                   {"entries[0].thresholds.two_shot_min_rows", "expected a row count"});
  expect_bad_table(table_json({entry_json(2, R"({"two_shots": 5})")}), {"entries[0].thresholds.two_shots", "unknown threshold"});
  expect_bad_table(table_json({entry_json(2, R"({"streaming_min_rows": -2})")}),
                   {"entries[0].thresholds.streaming_min_rows", "[-1, "});
  expect_bad_table(table_json({entry_json(2, "[]")}), {"entries[0].thresholds: expected an object"});
  expect_bad_table(table_json({entry_json(2, good, "plain", "2.28.3", R"("launch": {"publisher_ctas": 0}, )")}),
                   {"entries[0].launch.publisher_ctas", "[1, 1024]"});
  expect_bad_table(table_json({entry_json(2, good, "plain", "2.28.3", R"("launch": {"publishers": 4}, )")}),
                   {"entries[0].launch.publishers", "unknown launch shape"});
  expect_bad_table(table_json({entry_json(2, good, "bf16")}), {"entries[0].key.variant", "bf16"});
  std::string typo = entry_json(2, good);  // a misspelt optional member: not ignored (it would match every top_k)
  typo.replace(typo.find("\"tp\": 2"), 7, "\"tp\": 2, \"topk\": 6");
  expect_bad_table(table_json({typo}), {"entries[0].key.topk", "unknown key member"});
  std::string no_tp = entry_json(2, good);
  no_tp.replace(no_tp.find("\"tp\": 2, "), 9, "");
  expect_bad_table(table_json({no_tp}), {"entries[0].key.tp", "expected a value or \"*\""});
  std::string tp3 = entry_json(2, good);
  tp3.replace(tp3.find("\"tp\": 2"), 7, "\"tp\": 9");
  expect_bad_table(table_json({tp3}), {"entries[0].key.tp", "[1, 8]"});
  std::string prov = entry_json(2, good);
  prov.replace(prov.find("\"measured\""), 10, "\"guessed\"");
  expect_bad_table(table_json({prov}), {"entries[0].provenance", "\"measured\" or \"extrapolated\""});
  expect_bad_table(table_json({entry_json(2, good), entry_json(2, good)}), {"entries[1].key", "the same key as entries[0]"});
}

// What an adversarial review fed the loader (2026-12-03): each an Error(kInvalidArgument)
// naming the file, never another exception, a crash or a silent choice.
TEST(TuningParse, HostileTablesAreErrorsNamingTheFile) {
  const std::string good = R"({"two_shot_min_rows": 1024})";
  // A number beyond double's range: nlohmann's out_of_range, not a parse_error.
  expect_bad_table(R"({"schema_version": 1e400, "entries": []})", {"the document", "1e400"});
  expect_bad_table(table_json({entry_json(2, good, "plain", "2.28.3", R"("created": -1e400, )")}), {"the document"});
  // A deeply nested array where an integer is expected: named by its size, not serialized
  // (the serializer recurses: 75,000 levels overflowed an 8 MB stack).
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_bad_table(R"({"schema_version": )" + deep + R"(, "entries": []})",
                   {"schema_version", "expected an integer, got array (an array of 1 elements)"});
  const auto [code, msg] = error_of([&] {
    tuning::parse_table(table_json({entry_json(2, R"({"two_shot_min_rows": ")" + std::string(100000, 'x') + R"("})")}),
                        "t.json");
  });
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_LT(msg.size(), 600u) << "the wrong value is cut, not copied whole";
  // Integers beyond int64: refused, not taken as "never".
  expect_bad_table(table_json({entry_json(2, R"({"two_shot_min_rows": 9223372036854775808})")}),
                   {"entries[0].thresholds.two_shot_min_rows", "expected an integer in [1, "});
  expect_bad_table(table_json({entry_json(2, R"({"two_shot_min_rows": 18446744073709551615})")}),
                   {"entries[0].thresholds.two_shot_min_rows"});
  // A member twice in one object: the last would win silently.
  expect_bad_table(table_json({entry_json(2, R"({"two_shot_min_rows": 0, "two_shot_min_rows": 5})")}),
                   {"the member \"two_shot_min_rows\" appears twice"});
  expect_bad_table(R"({"schema_version": 2, "schema_version": 1, "entries": []})", {"\"schema_version\" appears twice"});
  // The same name in two objects is no duplicate.
  EXPECT_EQ(tuning::parse_table(table_json({entry_json(2, good), entry_json(2, good, "mxfp8")}), "t.json").entries.size(), 2u);
  // Two entries whose NCCL differs in the patch level only both match a process: refused.
  expect_bad_table(table_json({entry_json(2, good, "plain", "2.28.3"), entry_json(2, good, "plain", "2.28.9")}),
                   {"entries[1].key", "the same key as entries[0]", "major.minor: 2.28"});
  EXPECT_EQ(tuning::parse_table(table_json({entry_json(2, good, "plain", "2.28.3"), entry_json(2, good, "plain", "2.30.1")}),
                                "t.json").entries.size(), 2u);
  // The second adversarial review (2026-12-05): a misspelt member of an entry or of the
  // document was ignored (the entry used without the launch shapes meant), and a NUL byte
  // ended the text for the parser.
  expect_bad_table(table_json({entry_json(2, good, "plain", "2.28.3", R"("lanch": {"publisher_ctas": 100000}, )")}),
                   {"entries[0].lanch", "unknown entry member"});
  expect_bad_table(R"({"schema_version": 1, "entries": [], "entrys": 5})", {"entrys", "unknown member of the document"});
  expect_bad_table(std::string(R"({"schema_version": 1, "entries": []})") + '\0' + "junk", {"not valid JSON (a NUL byte)"});
  // What mhccl-tune writes beside the fields the loader reads is no error.
  EXPECT_EQ(tuning::parse_table(table_json({entry_json(2, good, "plain", "2.28.3",
                                                       R"("defaults": {}, "score": {}, "gain": [], "launch_timings": [], "guard": "g", "note": "n", )")}),
                                "t.json").entries.size(), 1u);
}

TEST(TuningParse, UnreadableFileNamesIt) {
  const auto [code, msg] = error_of([] { tuning::load_table("/nonexistent/mhccl-tune.json"); });
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("tuning table /nonexistent/mhccl-tune.json: cannot be read (No such file or directory"),
            std::string::npos) << msg;
  const auto [dcode, dmsg] = error_of([] { tuning::load_table(::testing::TempDir()); });
  EXPECT_EQ(dcode, ErrorCode::kInvalidArgument);
  EXPECT_NE(dmsg.find(": not a regular file ("), std::string::npos) << dmsg;
}

// What is not a regular file is refused before it is opened (a review, 2026-12-05): opening a
// FIFO for reading waited for a writer without end, /dev/zero grew the text until memory ran
// out; a path with a NUL named another file (the C string ends there).
TEST(TuningParse, OnlyARegularFileOfAFewMiBIsRead) {
  const std::string fifo = ::testing::TempDir() + "/mhccl-tuning-fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  for (const std::string& path : {fifo, std::string("/dev/zero")}) {
    const auto [code, msg] = error_of([&] { tuning::load_table(path); });
    EXPECT_EQ(code, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("tuning table " + path + ": not a regular file"), std::string::npos) << msg;
  }
  std::remove(fifo.c_str());
  const std::string big = ::testing::TempDir() + "/mhccl-tuning-big.json";
  {
    std::ofstream out(big);
    out << std::string((16 << 20) + 1, ' ');
  }
  const auto [bcode, bmsg] = error_of([&] { tuning::load_table(big); });
  EXPECT_NE(bmsg.find("larger than 16 MiB (16777217 bytes)"), std::string::npos) << bmsg;
  std::remove(big.c_str());
  // A regular file whose size says 0 and whose text never ends: read to the limit only.
  if (FILE* f = std::fopen("/proc/self/pagemap", "rb")) {
    std::fclose(f);
    const auto [pcode, pmsg] = error_of([] { tuning::load_table("/proc/self/pagemap"); });
    EXPECT_EQ(pcode, ErrorCode::kInvalidArgument);
    EXPECT_NE(pmsg.find("larger than 16 MiB"), std::string::npos) << pmsg;
  }
  const auto [ncode, nmsg] = error_of([] { tuning::load_table(std::string("/tmp/a.json\0.json", 17)); });
  EXPECT_EQ(ncode, ErrorCode::kInvalidArgument);
  EXPECT_NE(nmsg.find("the path holds a NUL character"), std::string::npos) << nmsg;
}

TEST(TuningParse, LoadsAFile) {
  const std::string path = ::testing::TempDir() + "/mhccl-tuning-test.json";
  std::ofstream(path) << table_json({entry_json(2, R"({"two_shot_min_rows": 777})")});
  const tuning::Table t = tuning::load_table(path);
  EXPECT_EQ(t.path, path);
  ASSERT_EQ(t.entries.size(), 1u);
  EXPECT_EQ(*t.entries[0].settings.two_shot_min_rows, 777);
  std::ofstream(path) << "{\"schema_version\": 1, \"entries\": [\n  {\"key\": {\"tp\": 2}, \"provenance\": 3}]}";
  const auto [code, msg] = error_of([&] { tuning::load_table(path); });
  EXPECT_NE(msg.find("tuning table " + path + ": entries[0].key.gpu"), std::string::npos) << msg;
  std::remove(path.c_str());
}

// --- Matching and staleness ------------------------------------------------------------------

TEST(TuningMatch, ExactKeyOnly) {
  const tuning::Table t = tuning::parse_table(
      table_json({entry_json(2, R"({"two_shot_min_rows": 1000})"), entry_json(2, R"({"two_shot_min_rows": 1001})", "mxfp8"),
                  entry_json(4, R"({"two_shot_min_rows": 1002})")}),
      "t.json");
  auto rows = [&](const tuning::Key& k) {
    const tuning::Match m = tuning::match(t, k);
    return m.entry ? *m.entry->settings.two_shot_min_rows : int64_t{-1};
  };
  EXPECT_EQ(rows(h200_key(2)), 1000);
  EXPECT_EQ(rows(h200_key(2, "mxfp8")), 1001);
  EXPECT_EQ(rows(h200_key(4)), 1002);
  EXPECT_EQ(rows(h200_key(8)), -1);
  EXPECT_EQ(rows(h200_key(2, "fp8")), -1);
  tuning::Key k = h200_key(2);
  k.gpu = "NVIDIA H100 80GB HBM3";
  EXPECT_EQ(rows(k), -1);
  k = h200_key(2);
  k.sms = 114;
  EXPECT_EQ(rows(k), -1);
  k = h200_key(2);
  k.p2p = "none";
  EXPECT_EQ(rows(k), -1);
  k = h200_key(2);
  k.hidden = 7168;
  EXPECT_EQ(rows(k), -1);
  k = h200_key(2);
  k.hc = 8;
  EXPECT_EQ(rows(k), -1);
  k = h200_key(2);
  k.gpu = "nvidia h200";  // strings compare exactly
  EXPECT_EQ(rows(k), -1);
  const tuning::Match none = tuning::match(t, h200_key(8));
  EXPECT_NE(none.why.find("no entry for gpu \"NVIDIA H200\", sms 132, p2p p2p, nccl 2.28.9, tp 8"), std::string::npos)
      << none.why;
}

TEST(TuningMatch, TheMostSpecificEntryWins) {
  const std::string any = R"({"key": {"gpu": "*", "sms": "*", "p2p": "*", "nccl": "*", "tp": 2, "hidden": "*", "hc": "*", "variant": "*"},
                              "provenance": "extrapolated", "thresholds": {"two_shot_min_rows": 5}})";
  const tuning::Table t = tuning::parse_table(table_json({any, entry_json(2, R"({"two_shot_min_rows": 6})")}), "t.json");
  EXPECT_EQ(*tuning::match(t, h200_key(2)).entry->settings.two_shot_min_rows, 6);
  EXPECT_EQ(*tuning::match(t, h200_key(2, "fp8")).entry->settings.two_shot_min_rows, 5);
}

TEST(TuningMatch, NcclPatchLevelsMatchOtherMajorMinorIsStale) {
  const tuning::Table t = tuning::parse_table(table_json({entry_json(2, R"({"two_shot_min_rows": 1000})", "plain", "2.28.3")}), "t.json");
  tuning::Key k = h200_key(2);
  for (const char* v : {"2.28.3", "2.28.9", "2.28.0"}) {
    k.nccl = v;
    EXPECT_NE(tuning::match(t, k).entry, nullptr) << v;
  }
  for (const char* v : {"2.27.7", "2.29.1", "3.28.3"}) {
    k.nccl = v;
    const tuning::Match m = tuning::match(t, k);
    EXPECT_EQ(m.entry, nullptr) << v;
    EXPECT_NE(m.why.find("stale: entries[0] was measured with NCCL 2.28.3, this process loaded " + std::string(v)),
              std::string::npos) << m.why;
  }
}

TEST(TuningMatch, AnotherMhcclMajorMinorIsStale) {
  const tuning::Table t = tuning::parse_table(
      table_json({entry_json(2, R"({"two_shot_min_rows": 1000})", "plain", "2.28.3", R"("mhccl": "0.0.7", )")}), "t.json");
  tuning::Key k = h200_key(2);
  k.mhccl = "0.1.0";
  const tuning::Match m = tuning::match(t, k);
  EXPECT_EQ(m.entry, nullptr);
  EXPECT_NE(m.why.find("stale: entries[0] was measured by mhccl 0.0.7, this is 0.1.0"), std::string::npos) << m.why;
  k.mhccl = "0.0.9";
  EXPECT_NE(tuning::match(t, k).entry, nullptr);
}

TEST(TuningMatch, AnotherSchemaVersionIsStaleNotAnError) {
  // Its entries may mean something else: not parsed, never used.
  const tuning::Table t = tuning::parse_table(R"({"schema_version": 2, "entries": "a format of the future"})", "t.json");
  EXPECT_EQ(t.schema_version, 2);
  EXPECT_TRUE(t.entries.empty());
  const tuning::Match m = tuning::match(t, h200_key(2));
  EXPECT_EQ(m.entry, nullptr);
  EXPECT_NE(m.why.find("stale: schema_version 2, this mhccl reads 1"), std::string::npos) << m.why;
  const tuning::Resolved r = tuning::resolve(dsv41(), h200_key(2), {}, &t);
  EXPECT_FALSE(r.table_used);
  EXPECT_EQ(r.cfg.two_shot_min_rows, 2048);  // the built-in default
  EXPECT_NE(r.source.find("tuning table t.json: stale: schema_version 2"), std::string::npos) << r.source;
  EXPECT_NE(r.source.find("using the built-in defaults (TP=2: measured)"), std::string::npos) << r.source;
  // Members, or a generator's type, that version 1 does not know are another version's own:
  // stale, not refused (a review, 2026-12-05: the member list was checked before the version).
  for (const char* doc : {R"({"schema_version": 2, "entries": 5, "fleet": {}})",
                          R"({"schema_version": 2, "generator": {"name": "mhccl-tune"}, "entries": []})",
                          R"({"schema_version": 0, "entries": []})"}) {
    const tuning::Table u = tuning::parse_table(doc, "u.json");
    EXPECT_NE(u.schema_version, tuning::kSchemaVersion) << doc;
    EXPECT_TRUE(u.entries.empty()) << doc;
  }
}

TEST(TuningMatch, KeyHelpers) {
  AllReduceMHCConfig c;
  EXPECT_EQ(tuning::variant_key(c), "plain");
  c.residual_only = true;
  EXPECT_EQ(tuning::variant_key(c), "residual_only");
  c.quantize_layer_input = true;
  EXPECT_EQ(tuning::variant_key(c), "mxfp8");
  c.quantize_layer_input = false;
  c.quantize_layer_input_fp8 = true;
  EXPECT_EQ(tuning::variant_key(c), "fp8");
  c.fp8_ue8m0_scales = true;
  EXPECT_EQ(tuning::variant_key(c), "fp8_ue8m0");
  EXPECT_EQ(tuning::p2p_key(1, true, false), "direct");
  EXPECT_EQ(tuning::p2p_key(1, true, true), "self");
  EXPECT_EQ(tuning::p2p_key(2, true, false), "p2p");
  EXPECT_EQ(tuning::p2p_key(8, false, true), "none");
}

// --- Precedence ---------------------------------------------------------------------------------

TEST(TuningResolve, TableOverBuiltinExplicitConfigOverTable) {
  const tuning::Table t = tuning::parse_table(
      table_json({entry_json(2, R"({"two_shot_min_rows": 1024, "two_shot_min_finalize_rows": 3000, "nccl_min_rows": 4096, "streaming_min_rows": 256})",
                             "plain", "2.28.3", R"("launch": {"publisher_ctas": 32, "reducer_ctas": 8}, )")}),
      "t.json");
  const tuning::Resolved r = tuning::resolve(dsv41(), h200_key(2), {}, &t);
  EXPECT_TRUE(r.table_used);
  EXPECT_EQ(r.cfg.two_shot_min_rows, 1024);
  EXPECT_EQ(r.cfg.two_shot_min_finalize_rows, 3000);
  EXPECT_EQ(r.cfg.nccl_min_rows, 4096);
  EXPECT_EQ(r.cfg.nccl_min_finalize_rows, kNever);  // not in the entry: built-in
  EXPECT_EQ(r.cfg.streaming_min_rows, 256);
  EXPECT_EQ(r.publisher_ctas[0], 32);
  EXPECT_EQ(r.publisher_ctas[1], 64);  // not in the entry: built-in
  EXPECT_EQ(r.reducer_ctas, 8);
  EXPECT_NE(r.source.find("tuning table t.json entries[0] (measured) for gpu \"NVIDIA H200\""), std::string::npos) << r.source;

  AllReduceMHCConfig explicit_cfg = dsv41();
  explicit_cfg.two_shot_min_rows = 100;
  explicit_cfg.two_shot_min_finalize_rows = 200;
  explicit_cfg.nccl_min_rows = 300;
  explicit_cfg.nccl_min_finalize_rows = 400;
  explicit_cfg.streaming_min_rows = 0;
  const tuning::Resolved e = tuning::resolve(explicit_cfg, h200_key(2), {}, &t);
  EXPECT_EQ(e.cfg.two_shot_min_rows, 100);
  EXPECT_EQ(e.cfg.two_shot_min_finalize_rows, 200);
  EXPECT_EQ(e.cfg.nccl_min_rows, 300);
  EXPECT_EQ(e.cfg.nccl_min_finalize_rows, 400);
  EXPECT_EQ(e.cfg.streaming_min_rows, 0);
  EXPECT_EQ(e.publisher_ctas[0], 32);  // the table still sets what the config cannot

  tuning::EnvOverrides env;
  env.streaming_min_rows = 2;
  env.publisher_ctas = 7;
  env.reducer_ctas = 9;
  env.ctas_per_row = 3;
  const tuning::Resolved v = tuning::resolve(explicit_cfg, h200_key(2), env, &t);
  EXPECT_EQ(v.cfg.streaming_min_rows, 2);  // the sweeps' variables over everything
  EXPECT_EQ(v.publisher_ctas[0], 7);
  EXPECT_EQ(v.publisher_ctas[1], 7);
  EXPECT_EQ(v.reducer_ctas, 9);
  EXPECT_EQ(v.ctas_per_row, 3);
  EXPECT_EQ(v.cfg.two_shot_min_rows, 100);
}

TEST(TuningResolve, NoMatchingEntryFallsBackToBuiltinSayingWhy) {
  const tuning::Table t = tuning::parse_table(table_json({entry_json(2, R"({"two_shot_min_rows": 1024})")}), "t.json");
  const tuning::Resolved r = tuning::resolve(dsv41(), h200_key(4), {}, &t);
  EXPECT_FALSE(r.table_used);
  EXPECT_EQ(r.cfg.two_shot_min_rows, 384);
  EXPECT_EQ(r.cfg.two_shot_min_finalize_rows, 512);
  EXPECT_NE(r.source.find("tuning table t.json: no entry for gpu \"NVIDIA H200\""), std::string::npos) << r.source;
  EXPECT_NE(r.source.find("built-in defaults (TP=4: extrapolated)"), std::string::npos) << r.source;
  EXPECT_EQ(r.source.find('\n'), std::string::npos);  // one line
}

// --- The agreement of table-derived fields -----------------------------------------------------

// As test_error_records.cpp's model of Communicator::Impl::agree: each rank's words, their
// elementwise max (what ncclMax gives every rank), each rank's verdict.
std::vector<std::string> agree_model(const std::vector<comm::ConfigFields>& ranks, const std::vector<bool>& valid) {
  std::vector<int> header;
  for (const auto& r : ranks) {
    const std::vector<int> w = comm::agreement_words(comm::agreement_header("AllReduceMHC", r), true);
    if (header.empty()) header = w;
    for (size_t i = 0; i < w.size(); ++i) header[i] = std::max(header[i], w[i]);
  }
  std::vector<int> reduced;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<int> w = comm::agreement_words(ranks[r], valid[r]);
    if (reduced.empty()) reduced = w;
    for (size_t i = 0; i < w.size(); ++i) reduced[i] = std::max(reduced[i], w[i]);
  }
  std::vector<std::string> verdicts;
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::string v = comm::agreement_header_error("AllReduceMHC", static_cast<int>(r), header);
    if (v.empty()) v = comm::agreement_error("AllReduceMHC", static_cast<int>(r), ranks[r], reduced);
    verdicts.push_back(v);
  }
  return verdicts;
}

// The fields each rank agrees on, with its own table text ("" for none), as the constructor
// resolves them (tuning::resolve, tuning::agreement_fields).
std::vector<comm::ConfigFields> ranks_with_tables(int tp, const std::vector<std::string>& tables) {
  std::vector<comm::ConfigFields> fields;
  for (int r = 0; r < static_cast<int>(tables.size()); ++r) {
    tuning::Table t;
    if (!tables[r].empty()) t = tuning::parse_table(tables[r], "rank" + std::to_string(r) + ".json");
    const tuning::Resolved res = tuning::resolve(dsv41(), h200_key(tp), {}, tables[r].empty() ? nullptr : &t);
    fields.push_back(tuning::agreement_fields(res, false));
  }
  return fields;
}

TEST(TuningAgreement, TheResolvedThresholdsAndShapesAreAgreedFields) {
  const tuning::Resolved r = tuning::resolve(dsv41(), h200_key(2), {}, nullptr);
  std::vector<std::string> names;
  for (const auto& f : tuning::agreement_fields(r, false)) names.push_back(f.first);
  for (const char* want : {"two_shot_min_rows", "two_shot_min_finalize_rows", "nccl_min_rows", "nccl_min_finalize_rows",
                           "streaming_min_rows", "publisher CTAs of call", "publisher CTAs of finalize", "reducer CTAs"}) {
    EXPECT_EQ(std::count_if(names.begin(), names.end(), [&](const std::string& n) { return n.rfind(want, 0) == 0; }), 1)
        << want;
  }
}

TEST(TuningAgreement, RanksWithTheSameTableAgree) {
  for (const int tp : {2, 4, 8}) {
    const std::string t = table_json({entry_json(tp, R"({"two_shot_min_rows": 640})")});
    for (const std::string& v : agree_model(ranks_with_tables(tp, std::vector<std::string>(tp, t)), std::vector<bool>(tp, true))) {
      EXPECT_EQ(v, "") << "tp=" << tp;
    }
    // A table whose entry is another machine's gives the built-in values: the same as no table.
    std::vector<std::string> tables(tp, "");
    tables[0] = table_json({entry_json(tp, R"({"two_shot_min_rows": 640})", "fp8")});
    for (const std::string& v : agree_model(ranks_with_tables(tp, tables), std::vector<bool>(tp, true))) EXPECT_EQ(v, "");
  }
}

TEST(TuningAgreement, RanksWhoseTablesDifferRaiseOnEveryRankNamingTheField) {
  struct Case {
    std::string thresholds, launch;
    const char* field;
    const char* not_field;
  };
  const std::vector<Case> cases = {
      {R"({"two_shot_min_rows": 640})", "", "two_shot_min_rows", "two_shot_min_finalize_rows"},
      {R"({"two_shot_min_finalize_rows": 700})", "", "two_shot_min_finalize_rows", "nccl_min_rows"},
      {R"({"nccl_min_rows": 4096})", "", "nccl_min_rows", "two_shot_min_rows"},
      {R"({"streaming_min_rows": 0})", "", "streaming_min_rows", "two_shot_min_rows"},
      {"{}", R"("launch": {"publisher_ctas": 32}, )", "publisher CTAs of call", "reducer CTAs"},
      {"{}", R"("launch": {"reducer_ctas": 32}, )", "reducer CTAs", "publisher CTAs"},
  };
  for (const int tp : {2, 3, 4, 8}) {  // 3 ranks modelled too: the agreement does not care
    const int key_tp = tp == 3 ? 4 : tp;
    for (const Case& k : cases) {
      for (const int odd : {0, tp - 1}) {
        // Every rank has a table; rank `odd`'s entry sets the value, the others' the built-in one
        // only (or no table at all on rank 1).
        std::vector<std::string> tables(tp, table_json({entry_json(key_tp, "{}")}));
        if (tp > 2) tables[1] = "";
        tables[odd] = table_json({entry_json(key_tp, k.thresholds, "plain", "2.28.3", k.launch)});
        std::vector<comm::ConfigFields> fields;
        for (int r = 0; r < tp; ++r) {
          tuning::Table t;
          if (!tables[r].empty()) t = tuning::parse_table(tables[r], "rank.json");
          fields.push_back(tuning::agreement_fields(
              tuning::resolve(dsv41(), h200_key(key_tp), {}, tables[r].empty() ? nullptr : &t), false));
        }
        const std::vector<std::string> v = agree_model(fields, std::vector<bool>(tp, true));
        for (int r = 0; r < tp; ++r) {
          EXPECT_NE(v[r].find("different configurations"), std::string::npos) << v[r];
          EXPECT_NE(v[r].find(k.field), std::string::npos) << "tp=" << tp << " rank " << r << ": " << v[r];
          EXPECT_EQ(v[r].find(k.not_field), std::string::npos) << v[r];
          EXPECT_NE(v[r].find("rank " + std::to_string(r)), std::string::npos) << v[r];
        }
      }
    }
  }
}

TEST(TuningAgreement, AMalformedTableOnOneRankFailsEveryRank) {
  // The rank whose table does not parse rethrows its own error (kInvalidArgument naming the
  // file); every other rank says another rank's configuration is invalid.
  for (const int tp : {2, 4, 8}) {
    const std::string good = table_json({entry_json(tp, R"({"two_shot_min_rows": 640})")});
    std::vector<comm::ConfigFields> fields = ranks_with_tables(tp, std::vector<std::string>(tp, good));
    std::vector<bool> valid(tp, true);
    const auto [code, msg] = error_of([&] { tuning::parse_table(good.substr(0, good.size() / 2), "/cfg/tune.json"); });
    EXPECT_NE(msg.find("tuning table /cfg/tune.json: line "), std::string::npos) << msg;
    valid[tp / 2] = false;
    const std::vector<std::string> v = agree_model(fields, valid);
    for (int r = 0; r < tp; ++r) {
      EXPECT_NE(v[r].find("another rank's configuration is invalid"), std::string::npos) << r << ": " << v[r];
    }
  }
}

// --- mhccl-tune --out: the table it writes, merged with one already there ----------------------

// A review (2026-12-05): --out /dev/stdout piped to tee, or a FIFO, was opened for reading after
// the sweep and blocked for good; an existing file whose schema_version was "1" or null ended
// the tool (an uncaught json::type_error) with the sweep's results already deleted.
TEST(TuneOutput, KeepsOtherKeysOfAReadableTableAndReplacesAnythingElse) {
  using nlohmann::json;
  const json fresh = json::array({json::parse(entry_json(2, R"({"two_shot_min_rows": 512})"))});
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/mhccl-tune-out-test.json";
  auto merged_from = [&](const std::string& old_text) {
    std::ofstream(path, std::ios::binary) << old_text;
    return tune::merged_table(path, fresh, "mhccl-tune --out x", "2026-12-05");
  };
  // A table of this schema: its entry of another key kept, the one of the fresh key replaced.
  json t = merged_from(table_json({entry_json(2, R"({"two_shot_min_rows": 1024})"),
                                   entry_json(4, R"({"two_shot_min_rows": 256})")}));
  ASSERT_EQ(t["entries"].size(), 2u);
  EXPECT_EQ(t["entries"][0]["key"]["tp"], 4);
  EXPECT_EQ(t["entries"][1]["thresholds"]["two_shot_min_rows"], 512);
  EXPECT_EQ(tuning::parse_table(t.dump(), "merged").entries.size(), 2u);  // the loader reads it
  // Anything else there is moved to PATH.bak (a table one hand-edited entry breaks is not lost),
  // and the table holds the fresh entries alone.
  const std::string bak = path + ".bak";
  for (const std::string& old : {std::string(R"({"schema_version": "1", "entries": []})"),
                                 std::string(R"({"schema_version": null, "entries": []})"),
                                 std::string(R"({"schema_version": 2, "entries": [1]})"), std::string("not json"),
                                 table_json({"3"}), table_json({entry_json(4, R"({"two_shot_min_rows": 0})")})}) {
    std::remove(bak.c_str());
    t = merged_from(old);
    ASSERT_EQ(t["entries"].size(), 1u) << old;
    EXPECT_EQ(t["entries"][0]["thresholds"]["two_shot_min_rows"], 512) << old;
    std::ifstream kept(bak, std::ios::binary);
    EXPECT_EQ(std::string((std::istreambuf_iterator<char>(kept)), std::istreambuf_iterator<char>()), old);
  }
  std::remove(bak.c_str());
  t = merged_from("");  // an empty file: nothing to keep
  EXPECT_EQ(t["entries"].size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(bak));
  std::remove(path.c_str());
  // A FIFO (no writer): never opened. In a child, killed if it blocks.
  const std::string fifo = dir + "/mhccl-tune-out-test.fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const pid_t pid = fork();
  if (pid == 0) _exit(tune::merged_table(fifo, fresh, "c", "d")["entries"].size() == 1 ? 0 : 1);
  int status = 0;
  for (int i = 0; i < 500 && waitpid(pid, &status, WNOHANG) == 0; ++i) usleep(20000);
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    ADD_FAILURE() << "merged_table blocked on a FIFO for 10 s";
  } else {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::remove(fifo.c_str());
}

}  // namespace
}  // namespace mhccl
