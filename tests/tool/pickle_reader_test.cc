// The restricted unpickler of ckpt-tool (tools/src/pickle_reader.h) on
// hand-made pickles: what torch.save writes is read, anything that would run
// code or exhaust the process is refused with a Status.
#include "pickle_reader.h"

#include <gtest/gtest.h>

#include <string>

namespace ckpt::tool {
namespace {

using namespace std::string_literals;

std::string P(std::initializer_list<std::string> parts) {
  std::string s = "\x80\x02";
  for (const auto& p : parts) s += p;
  return s + ".";
}

std::string Str(const std::string& v) {
  std::string s = "X";
  uint32_t n = static_cast<uint32_t>(v.size());
  for (int i = 0; i < 4; ++i) s += static_cast<char>((n >> (8 * i)) & 0xff);
  return s + v;
}

TEST(PickleReaderTest, ReadsADictOfNumbersStringsAndContainers) {
  // {'a': 5, 'b': 1.0, 'c': [True, None, (1, 2)], 'd': -70000}
  std::string one = std::string("G\x3f\xf0", 3) + std::string(6, '\0');
  auto v =
      Unpickle(P({"}q\x00"s, "(", Str("a"), "K\x05", Str("b"), one, Str("c"), "]q\x01(", "\x88",
                  "N", "K\x01K\x02\x86", "e", Str("d"), std::string("J\x90\xee\xfe\xff", 5), "u"}));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const PyValue& d = **v;
  ASSERT_EQ(d.kind, PyValue::Kind::kDict);
  EXPECT_EQ(d.Get("a")->i, 5);
  EXPECT_EQ(d.Get("b")->f, 1.0);
  const PyValue* c = d.Get("c");
  ASSERT_EQ(c->kind, PyValue::Kind::kList);
  ASSERT_EQ(c->items.size(), 3u);
  EXPECT_TRUE(c->items[0]->b);
  EXPECT_EQ(c->items[1]->kind, PyValue::Kind::kNone);
  EXPECT_EQ(c->items[2]->items[1]->i, 2);
  EXPECT_EQ(d.Get("d")->i, -70000);
}

TEST(PickleReaderTest, ReadsATensorAsTorchSaveWritesIt) {
  // _rebuild_tensor_v2(('storage', torch.FloatStorage, '0', 'cpu', 6), 2, (2, 2), (2, 1),
  //                    False, OrderedDict())
  std::string pid =
      "(" + Str("storage") + "ctorch\nFloatStorage\n" + Str("0") + Str("cpu") + "K\x06tQ";
  auto v = Unpickle(P({"ctorch._utils\n_rebuild_tensor_v2\n(", pid, "K\x02", "K\x02K\x02\x86",
                       "K\x02K\x01\x86", "\x89", "ccollections\nOrderedDict\n)R", "tR"}));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const PyValue& t = **v;
  ASSERT_EQ(t.kind, PyValue::Kind::kTensor);
  EXPECT_EQ(t.dtype, format::DType::kF32);
  EXPECT_EQ(t.storage_key, "0");
  EXPECT_EQ(t.storage_offset, 2);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t.stride, (std::vector<int64_t>{2, 1}));
}

TEST(PickleReaderTest, AnOrderedDictWithMetadataIsADict) {
  // torch.save(model.state_dict()): OrderedDict() with BUILD of {'_metadata': ...}
  auto v = Unpickle(P({"ccollections\nOrderedDict\nq\x00)Rq\x01"s, "(", Str("x"), "K\x01", "u", "}",
                       Str("_metadata"), "}s", "b"}));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ((*v)->kind, PyValue::Kind::kDict);
  EXPECT_EQ((*v)->Get("x")->i, 1);
  EXPECT_EQ((*v)->Get("_metadata"), nullptr);
}

TEST(PickleReaderTest, RefusesCode) {
  for (const char* global : {"cposix\nsystem\n", "cbuiltins\neval\n", "cos\nsystem\n",
                             "ctorch\nload\n", "c__builtin__\ngetattr\n"}) {
    auto v = Unpickle(P({std::string(global), "(", Str("touch /tmp/x"), "tR"}));
    ASSERT_FALSE(v.ok()) << global;
    EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition) << v.status().ToString();
    EXPECT_NE(v.status().message().find("refused"), std::string::npos);
  }
  // STACK_GLOBAL (protocol 4) is checked the same way.
  auto v = Unpickle(P({Str("os"), Str("system"), "\x93"}));
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  // A REDUCE of an allowed name with the wrong shape of arguments is refused too.
  v = Unpickle(P({"ccollections\nOrderedDict\n(K\x01tR"}));
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption);
}

TEST(PickleReaderTest, RefusesMalformedInput) {
  const std::vector<std::string> cases = {
      "",          // empty
      "\x80\x02",  // no STOP
      P({"X\xff\xff\xff\x7f"
         "abc"}),                                // string longer than the input
      P({"i"}),                                  // INST: outside the subset
      P({"h\x07"}),                              // memo never set
      P({"u"}),                                  // SETITEMS without MARK
      P({"K\x01K\x02"}),                         // two values left on the stack
      P({"]K\x01s"}),                            // SETITEM on a list
      P({"\x8a\x09" + std::string(9, '\x01')}),  // integer wider than 64 bits
      P({"\x80\x09"}),                           // protocol 9
  };
  for (const auto& c : cases) {
    auto v = Unpickle(c);
    EXPECT_FALSE(v.ok()) << testing::PrintToString(c);
    if (!v.ok()) {
      EXPECT_EQ(v.status().code(), StatusCode::kCorruption) << v.status().ToString();
    }
  }
}

TEST(PickleReaderTest, BoundsStackDepthAndMemoCopies) {
  // 100,000 nested lists: refused by the stack bound, no deep recursion.
  std::string deep = "\x80\x02";
  for (int i = 0; i < 100000; ++i) deep += "]";
  auto v = Unpickle(deep + ".");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("too deep"), std::string::npos) << v.status().ToString();

  // A list that appends copies of itself: exponential if copies were free.
  std::string laughs = "\x80\x02]q\x00"s;
  for (int i = 0; i < 40; ++i)
    laughs +=
        "h\x00"
        "h\x00"
        "a"
        "a"s;
  v = Unpickle(laughs + ".");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("copied"), std::string::npos) << v.status().ToString();

  // A dict that would contain itself gets a copy of itself instead: no cycle.
  v = Unpickle(P({"}q\x00"s, Str("self"), "h\x00"s, "s"}));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const PyValue* inner = (*v)->Get("self");
  ASSERT_NE(inner, nullptr);
  EXPECT_NE(inner, v->get());
  EXPECT_EQ(inner->Get("self"), nullptr);
}

// corpus/pickle/crash_deep_tuple_nesting (a stack overflow under ASan and without):
// TUPLE1 nests one level per byte without growing the stack, and destroying
// 200,000 levels overflowed the C++ stack.
TEST(PickleReaderTest, BoundsNestingAtItsLimit) {
  auto nested = [](int levels) {
    std::string p = "\x80\x02N";
    for (int i = 0; i < levels; ++i) p += "\x85";
    return p + ".";
  };
  auto v = Unpickle(nested(kMaxPickleNesting));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ((*v)->depth, kMaxPickleNesting);
  v = Unpickle(nested(kMaxPickleNesting + 1));
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kCorruption);
  EXPECT_NE(v.status().message().find("nest deeper than 64 levels"), std::string::npos)
      << v.status().ToString();
  v = Unpickle(nested(200000));
  ASSERT_FALSE(v.ok());

  // Lists nested by APPEND are bounded the same way.
  std::string lists = "\x80\x02";
  for (int i = 0; i <= kMaxPickleNesting + 1; ++i) lists += "]";
  for (int i = 0; i <= kMaxPickleNesting; ++i) lists += "a";
  v = Unpickle(lists + ".");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("nest deeper"), std::string::npos) << v.status().ToString();
}

// corpus/pickle/leak_dup_self_append (ASan's leak checker on the unpickler):
// DUP pushed the same list twice and APPEND put it inside itself, a cycle of
// shared_ptrs that leaked (and that a walk would follow forever).
TEST(PickleReaderTest, DupCopiesSoNoValueContainsItself) {
  auto v = Unpickle(P({"]2a"}));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const PyValue& list = **v;
  ASSERT_EQ(list.kind, PyValue::Kind::kList);
  ASSERT_EQ(list.items.size(), 1u);
  EXPECT_NE(list.items[0].get(), &list);
  EXPECT_TRUE(list.items[0]->items.empty());
}

TEST(PickleReaderTest, RepeatedKeysKeepTheirPlaceAndTakeTheLastValue) {
  auto v = Unpickle(P({"}(", Str("a"), "K\x01", Str("b"), "K\x02", "K\x07", Str("i"), Str("a"),
                       "K\x03", "K\x07", Str("j"), "u"}));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const PyValue& d = **v;
  ASSERT_EQ(d.dict.size(), 3u);
  EXPECT_EQ(d.dict[0].first->s, "a");
  EXPECT_EQ(d.dict[0].second->i, 3);
  EXPECT_EQ(d.dict[2].first->i, 7);
  EXPECT_EQ(d.dict[2].second->s, "j");

  // 100,000 distinct keys are read in linear time (the test would time out
  // when each insertion scanned the dict).
  // (in SETITEMS of 1,000 pairs: the stack holds 8,192 items)
  std::string many = "\x80\x02}";
  for (int i = 0; i < 100000; ++i) {
    if (i % 1000 == 0) many += "(";
    many += Str("k" + std::to_string(i)) + "K\x01";
    if (i % 1000 == 999) many += "u";
  }
  v = Unpickle(many + ".");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ((*v)->dict.size(), 100000u);
}

TEST(PickleReaderTest, FillTensorDataChecksLayoutAndBounds) {
  auto tensor = [](const std::string& sizes, const std::string& strides,
                   const std::string& offset) {
    std::string pid =
        "(" + Str("storage") + "ctorch\nFloatStorage\n" + Str("s") + Str("cpu") + "K\x06tQ";
    return Unpickle(P({"ctorch._utils\n_rebuild_tensor_v2\n(", pid, offset, "(" + sizes + "t",
                       "(" + strides + "t", "\x89", "}", "tR"}));
  };
  const std::string storage(24, '\x01');  // six floats
  auto bytes = [&](const std::string& key) -> StatusOr<std::string_view> {
    if (key != "s") return Status::NotFound(key);
    return std::string_view(storage);
  };
  auto t = tensor("K\x02K\x03", "K\x03K\x01", "K\x00"s);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(FillTensorData(t->get(), bytes, "f.pt", 1 << 20).ok());
  EXPECT_EQ((*t)->data.size(), 24u);

  // One element past the storage.
  t = tensor("K\x02K\x03", "K\x03K\x01", "K\x01");
  ASSERT_TRUE(t.ok());
  Status s = FillTensorData(t->get(), bytes, "f.pt", 1 << 20);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("reaches past its storage"), std::string::npos) << s.ToString();

  // Transposed: not contiguous.
  t = tensor("K\x02K\x03", "K\x01K\x02", "K\x00"s);
  ASSERT_TRUE(t.ok());
  s = FillTensorData(t->get(), bytes, "f.pt", 1 << 20);
  EXPECT_NE(s.message().find("not contiguous"), std::string::npos) << s.ToString();

  // No elements, other sizes of 2^32 each: their product does not fit in 64
  // bits (signed overflow before), and there is nothing to read.
  const std::string big = "\x8a\x05"s + std::string("\x00\x00\x00\x00\x01", 5);
  t = tensor("K\x00"s + big + big, "K\x01" + big + "K\x01", "K\x00"s);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  s = FillTensorData(t->get(), bytes, "f.pt", 1 << 20);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE((*t)->data.empty());

  // A storage the archive does not have.
  std::string pid =
      "(" + Str("storage") + "ctorch\nFloatStorage\n" + Str("x") + Str("cpu") + "K\x06tQ";
  t = Unpickle(P({"ctorch._utils\n_rebuild_tensor_v2\n(", pid, "K\x00"s, "(K\x01t", "(K\x01t",
                  "\x89", "}", "tR"}));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  s = FillTensorData(t->get(), bytes, "f.pt", 1 << 20);
  EXPECT_NE(s.message().find("f.pt: storage record data/x is missing"), std::string::npos)
      << s.ToString();
}

// Views that claim more than the file: many tensors over one storage each
// copy it, and together they are refused past the cap before the copy that
// would pass it (`.pt` import used to copy every view, however many).
TEST(PickleReaderTest, TensorsViewingMoreThanTheCapAreRefused) {
  const std::string pid =
      "(" + Str("storage") + "ctorch\nFloatStorage\n" + Str("s") + Str("cpu") + "K\x06tQ";
  const std::string tensor =
      "ctorch._utils\n_rebuild_tensor_v2\n(" + pid + "K\x00(K\x06t(K\x01t\x89}tR"s;
  std::string views = "\x80\x02](";
  for (int i = 0; i < 1000; ++i) views += tensor;
  views += "e.";
  const std::string storage(24, '\x01');  // six floats, viewed 1000 times
  auto bytes = [&](const std::string& key) -> StatusOr<std::string_view> {
    if (key != "s") return Status::NotFound(key);
    return std::string_view{storage};
  };
  auto t = Unpickle(views);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ((*t)->items.size(), 1000u);
  EXPECT_TRUE(FillTensorData(t->get(), bytes, "f.pt", 24000).ok());
  t = Unpickle(views);
  ASSERT_TRUE(t.ok());
  Status s = FillTensorData(t->get(), bytes, "f.pt", 23999);
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("f.pt: its tensors hold more than 23999 bytes together, the cap for "
                             "this file"),
            std::string::npos)
      << s.ToString();
  // The copies stop at the cap: the tensor that would pass it holds nothing.
  size_t held = 0;
  for (const auto& v : (*t)->items) held += v->data.size();
  EXPECT_EQ(held, 23976u);
}

}  // namespace
}  // namespace ckpt::tool
