#include "pickle_reader.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <unordered_map>

namespace ckpt::tool {
namespace {

// Bounds that keep a hostile pickle from exhausting the stack (destroying a
// deeply nested value recurses), memory (memo copies) or time (dict keys).
constexpr size_t kMaxStack = kMaxPickleStack;
constexpr size_t kMaxMemo = 1 << 22;
constexpr size_t kMaxCopiedNodes = size_t{1} << 20;

PyRef Make(PyValue::Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

std::string Hex2(uint8_t b) {
  const char* d = "0123456789abcdef";
  return std::string{'0', 'x', d[b >> 4], d[b & 15]};
}

class Unpickler {
 public:
  explicit Unpickler(std::string_view p) : p_(p) {}

  StatusOr<PyRef> Run() {
    while (true) {
      if (pos_ >= p_.size()) return Bad("the pickle ends without STOP");
      const size_t at = pos_;
      const uint8_t op = static_cast<uint8_t>(p_[pos_++]);
      Status s = Step(op, at);
      if (!s.ok()) return s;
      if (stopped_) break;
    }
    if (stack_.size() != 1 || !marks_.empty()) return Bad("the pickle leaves its stack unbalanced");
    return stack_.back();
  }

 private:
  Status Bad(const std::string& why) const {
    return Status::Corruption("pickle offset " + std::to_string(pos_) + ": " + why);
  }

  Status Need(size_t n) const {
    if (p_.size() - pos_ < n) return Bad("truncated");
    return Status::OK();
  }

  StatusOr<uint64_t> ReadLe(size_t n) {
    CKPT_RETURN_IF_ERROR(Need(n));
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(p_[pos_ + i])} << (8 * i);
    pos_ += n;
    return v;
  }

  StatusOr<std::string> ReadBytes(uint64_t n) {
    if (n > p_.size() - pos_) return Bad("a string runs past the end");
    std::string s(p_.substr(pos_, static_cast<size_t>(n)));
    pos_ += static_cast<size_t>(n);
    return s;
  }

  StatusOr<std::string> ReadLine() {
    size_t nl = p_.find('\n', pos_);
    if (nl == std::string_view::npos || nl - pos_ > 256) return Bad("a GLOBAL name is malformed");
    std::string s(p_.substr(pos_, nl - pos_));
    pos_ = nl + 1;
    return s;
  }

  Status Push(PyRef v) {
    if (stack_.size() >= kMaxStack) return Bad("the stack is too deep");
    stack_.push_back(std::move(v));
    return Status::OK();
  }

  StatusOr<PyRef> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      return Bad("pop from an empty stack");
    }
    PyRef v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }

  StatusOr<PyRef*> Top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      return Bad("empty stack");
    }
    return &stack_.back();
  }

  // The items above the last MARK, removed from the stack.
  StatusOr<std::vector<PyRef>> PopMark() {
    if (marks_.empty()) return Bad("no MARK");
    size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }

  Status Memo(uint64_t index) {
    if (stack_.empty()) return Bad("memoize with an empty stack");
    if (index >= kMaxMemo) return Bad("memo index too large");
    memo_[index] = stack_.back();
    return Status::OK();
  }

  // A memo read is a copy of the value as it is now, so no value can come to
  // contain itself; copies are bounded in depth and in total size.
  StatusOr<PyRef> Copy(const PyRef& v, int depth) {
    if (depth > kMaxPickleNesting) return Bad("a memoized value nests too deep");
    if (++copied_ > kMaxCopiedNodes) return Bad("memoized values are copied too often");
    if (v->kind != PyValue::Kind::kList && v->kind != PyValue::Kind::kTuple &&
        v->kind != PyValue::Kind::kDict) {
      return v;  // immutable here
    }
    auto c = std::make_shared<PyValue>();
    c->kind = v->kind;
    c->depth = v->depth;
    for (const auto& x : v->items) {
      CKPT_ASSIGN_OR_RETURN(PyRef y, Copy(x, depth + 1));
      c->items.push_back(std::move(y));
    }
    for (const auto& [k, x] : v->dict) {
      CKPT_ASSIGN_OR_RETURN(PyRef y, Copy(x, depth + 1));
      c->dict.emplace_back(k, std::move(y));
    }
    return c;
  }

  Status GetMemo(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Bad("memo " + std::to_string(index) + " is not set");
    CKPT_ASSIGN_OR_RETURN(PyRef v, Copy(it->second, 0));
    return Push(std::move(v));
  }

  Status Global(const std::string& module, const std::string& name) {
    const std::string full = module + "." + name;
    bool allowed = full == "collections.OrderedDict" || full == "torch._utils._rebuild_tensor_v2" ||
                   full == "torch._utils._rebuild_parameter";
    if (module == "torch" && StorageDType(name).ok()) allowed = true;
    if (!allowed) {
      return Status::FailedPrecondition(
          "the pickle refers to " + full +
          ": pickled code or objects are refused (only tensors, numbers, strings and containers "
          "are read; nothing is executed)");
    }
    PyRef g = Make(PyValue::Kind::kGlobal);
    g->s = full;
    return Push(g);
  }

  // Records that container `c` now holds `x`: nesting is bounded here, where
  // every container gets its items (containers are never shared, so depths
  // stay exact).
  Status Contain(PyValue* c, const PyValue& x) {
    if (x.depth + 1 > kMaxPickleNesting) {
      return Bad("values nest deeper than " + std::to_string(kMaxPickleNesting) + " levels");
    }
    c->depth = std::max(c->depth, x.depth + 1);
    return Status::OK();
  }

  // Where each key of a dict being filled is, so that SETITEMS is linear (the
  // dict is held, so its address is not reused while the index exists).
  struct DictIndex {
    PyRef dict;
    std::unordered_map<std::string, size_t> strings;
    std::unordered_map<int64_t, size_t> ints;
  };

  DictIndex* IndexOf(const PyRef& dict) {
    auto it = dict_index_.find(dict.get());
    if (it != dict_index_.end()) return &it->second;
    DictIndex& idx = dict_index_[dict.get()];
    idx.dict = dict;
    for (size_t i = 0; i < dict->dict.size(); ++i) {
      const PyValue& k = *dict->dict[i].first;
      if (k.kind == PyValue::Kind::kString) idx.strings.emplace(k.s, i);
      if (k.kind == PyValue::Kind::kInt) idx.ints.emplace(k.i, i);
    }
    return &idx;
  }

  // As DictSet (a string or int key already there keeps its place and takes
  // the new value), through the index.
  Status SetItems(const std::vector<PyRef>& kv) {
    if (kv.size() % 2 != 0) return Bad("SETITEMS with an odd number of items");
    CKPT_ASSIGN_OR_RETURN(PyRef * top, Top());
    if ((*top)->kind != PyValue::Kind::kDict) return Bad("SETITEMS on something not a dict");
    PyValue* dict = top->get();
    DictIndex* idx = IndexOf(*top);
    for (size_t i = 0; i < kv.size(); i += 2) {
      CKPT_RETURN_IF_ERROR(Contain(dict, *kv[i]));
      CKPT_RETURN_IF_ERROR(Contain(dict, *kv[i + 1]));
      const PyValue& key = *kv[i];
      size_t at = dict->dict.size();
      if (key.kind == PyValue::Kind::kString) {
        at = idx->strings.emplace(key.s, at).first->second;
      } else if (key.kind == PyValue::Kind::kInt) {
        at = idx->ints.emplace(key.i, at).first->second;
      }
      if (at < dict->dict.size()) {
        dict->dict[at].second = kv[i + 1];
        continue;
      }
      if (dict->dict.size() >= kMaxPickleDictItems) {
        return Bad("a dict holds more than " + std::to_string(kMaxPickleDictItems) + " items");
      }
      dict->dict.emplace_back(kv[i], kv[i + 1]);
    }
    return Status::OK();
  }

  Status Appends(const std::vector<PyRef>& items) {
    CKPT_ASSIGN_OR_RETURN(PyRef * top, Top());
    if ((*top)->kind != PyValue::Kind::kList) return Bad("APPENDS on something not a list");
    for (const auto& v : items) {
      CKPT_RETURN_IF_ERROR(Contain(top->get(), *v));
      (*top)->items.push_back(v);
    }
    return Status::OK();
  }

  // A tuple of `items`.
  Status PushTuple(std::vector<PyRef> items) {
    PyRef t = Make(PyValue::Kind::kTuple);
    for (const auto& x : items) CKPT_RETURN_IF_ERROR(Contain(t.get(), *x));
    t->items = std::move(items);
    return Push(std::move(t));
  }

  StatusOr<std::vector<int64_t>> IntTuple(const PyValue& v, const char* what) {
    if (v.kind != PyValue::Kind::kTuple && v.kind != PyValue::Kind::kList) {
      return Bad(std::string(what) + " is not a tuple");
    }
    if (v.items.size() > static_cast<size_t>(format::kMaxRank)) {
      return Bad(std::string(what) + " has more than 8 dimensions");
    }
    std::vector<int64_t> out;
    for (const auto& x : v.items) {
      if (x->kind != PyValue::Kind::kInt || x->i < 0) {
        return Bad(std::string(what) + " holds something not a non-negative int");
      }
      out.push_back(x->i);
    }
    return out;
  }

  // ---- opcode handlers: each reads its operands after the opcode at pos_ ----

  // REDUCE: an empty OrderedDict, or a tensor rebuilt; any other call is refused.
  Status OpReduce(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(PyRef args, Pop());
    CKPT_ASSIGN_OR_RETURN(PyRef fn, Pop());
    if (fn->kind != PyValue::Kind::kGlobal || args->kind != PyValue::Kind::kTuple) {
      return Bad("REDUCE of something not a known callable");
    }
    if (fn->s == "collections.OrderedDict") {
      if (!args->items.empty()) return Bad("OrderedDict with arguments");
      return Push(Make(PyValue::Kind::kDict));
    }
    if (fn->s == "torch._utils._rebuild_parameter") {
      if (args->items.empty() || args->items[0]->kind != PyValue::Kind::kTensor) {
        return Bad("_rebuild_parameter of something not a tensor");
      }
      return Push(args->items[0]);
    }
    if (fn->s == "torch._utils._rebuild_tensor_v2") {
      if (args->items.size() < 4) return Bad("_rebuild_tensor_v2 with too few arguments");
      const PyValue& st = *args->items[0];
      if (st.kind != PyValue::Kind::kStorage) return Bad("_rebuild_tensor_v2 of no storage");
      if (args->items[1]->kind != PyValue::Kind::kInt || args->items[1]->i < 0) {
        return Bad("_rebuild_tensor_v2 with a bad storage offset");
      }
      PyRef t = Make(PyValue::Kind::kTensor);
      t->dtype = st.dtype;
      t->storage_key = st.s;
      t->storage_offset = args->items[1]->i;
      CKPT_ASSIGN_OR_RETURN(t->shape, IntTuple(*args->items[2], "a tensor's size"));
      CKPT_ASSIGN_OR_RETURN(t->stride, IntTuple(*args->items[3], "a tensor's stride"));
      if (t->shape.size() != t->stride.size())
        return Bad("a tensor's size and stride differ in rank");
      return Push(t);
    }
    return Bad("REDUCE of " + fn->s);
  }

  // BINPERSID: a torch storage.
  Status OpPersistentId(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(PyRef pid, Pop());
    if (pid->kind != PyValue::Kind::kTuple || pid->items.size() < 3 ||
        pid->items[0]->kind != PyValue::Kind::kString || pid->items[0]->s != "storage" ||
        pid->items[1]->kind != PyValue::Kind::kGlobal ||
        pid->items[2]->kind != PyValue::Kind::kString) {
      return Bad("a persistent id that is not ('storage', torch.<T>Storage, key, ...)");
    }
    const std::string& g = pid->items[1]->s;
    CKPT_ASSIGN_OR_RETURN(format::DType dtype, StorageDType(g.substr(g.rfind('.') + 1)));
    PyRef st = Make(PyValue::Kind::kStorage);
    st->dtype = dtype;
    st->s = pid->items[2]->s;
    for (char c : st->s) {
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            c == '_')) {
        return Bad("a storage key with a bad character");
      }
    }
    return Push(st);
  }

  Status OpProto(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(uint64_t v, ReadLe(1));
    if (v > 5) return Bad("pickle protocol " + std::to_string(v));
    return Status::OK();
  }

  Status OpFrame(uint8_t) { return ReadLe(8).status(); }

  Status OpMark(uint8_t) {
    marks_.push_back(stack_.size());
    return Status::OK();
  }

  Status OpStop(uint8_t) {
    stopped_ = true;
    return Status::OK();
  }

  // EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE.
  Status OpEmpty(uint8_t op) {
    using K = PyValue::Kind;
    return Push(Make(op == '}' ? K::kDict : (op == ']' ? K::kList : K::kTuple)));
  }

  Status OpTuple(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(auto items, PopMark());
    return PushTuple(std::move(items));
  }

  // TUPLE1, TUPLE2, TUPLE3.
  Status OpTupleN(uint8_t op) {
    const size_t n = op - 0x84;
    std::vector<PyRef> items(n);
    for (size_t i = n; i-- > 0;) {
      CKPT_ASSIGN_OR_RETURN(items[i], Pop());
    }
    return PushTuple(std::move(items));
  }

  Status OpSetItem(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(PyRef v, Pop());
    CKPT_ASSIGN_OR_RETURN(PyRef k, Pop());
    return SetItems({k, v});
  }

  Status OpSetItems(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(auto kv, PopMark());
    return SetItems(kv);
  }

  Status OpAppend(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(PyRef v, Pop());
    return Appends({v});
  }

  Status OpAppends(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(auto items, PopMark());
    return Appends(items);
  }

  // BINPUT (1-byte index), LONG_BINPUT (4-byte).
  Status OpPut(uint8_t op) {
    CKPT_ASSIGN_OR_RETURN(uint64_t i, ReadLe(op == 'q' ? 1 : 4));
    return Memo(i);
  }

  Status OpMemoize(uint8_t) { return Memo(memo_.size()); }

  // BINGET (1-byte index), LONG_BINGET (4-byte).
  Status OpGet(uint8_t op) {
    CKPT_ASSIGN_OR_RETURN(uint64_t i, ReadLe(op == 'h' ? 1 : 4));
    return GetMemo(i);
  }

  Status OpGlobal(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(std::string module, ReadLine());
    CKPT_ASSIGN_OR_RETURN(std::string name, ReadLine());
    return Global(module, name);
  }

  Status OpStackGlobal(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(PyRef name, Pop());
    CKPT_ASSIGN_OR_RETURN(PyRef module, Pop());
    if (name->kind != PyValue::Kind::kString || module->kind != PyValue::Kind::kString) {
      return Bad("STACK_GLOBAL of something not two strings");
    }
    return Global(module->s, name->s);
  }

  // BUILD: only the state of an OrderedDict (its _metadata), dropped.
  Status OpBuild(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(PyRef state, Pop());
    CKPT_ASSIGN_OR_RETURN(PyRef * top, Top());
    if ((*top)->kind != PyValue::Kind::kDict) return Bad("BUILD of something not a dict");
    (void)state;
    return Status::OK();
  }

  // BININT (4 bytes, signed), BININT1 (1, unsigned), BININT2 (2, unsigned).
  Status OpBinInt(uint8_t op) {
    if (op == 'J') {
      CKPT_ASSIGN_OR_RETURN(uint64_t v, ReadLe(4));
      return Push(MakeInt(static_cast<int32_t>(static_cast<uint32_t>(v))));
    }
    CKPT_ASSIGN_OR_RETURN(uint64_t v, ReadLe(op == 'K' ? 1 : 2));
    return Push(MakeInt(static_cast<int64_t>(v)));
  }

  Status OpLong1(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(uint64_t n, ReadLe(1));
    if (n > 8) return Bad("an integer wider than 64 bits");
    if (n == 0) return Push(MakeInt(0));
    CKPT_ASSIGN_OR_RETURN(uint64_t v, ReadLe(n));
    if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return Push(MakeInt(static_cast<int64_t>(v)));
  }

  // BINFLOAT, big-endian.
  Status OpBinFloat(uint8_t) {
    CKPT_RETURN_IF_ERROR(Need(8));
    uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<uint8_t>(p_[pos_ + i]);
    pos_ += 8;
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    return Push(MakeFloat(d));
  }

  // The length-prefixed strings: SHORT_BINUNICODE, SHORT_BINSTRING and
  // SHORT_BINBYTES (1-byte length), BINUNICODE8 (8), the others (4); the
  // BINBYTES forms are bytes.
  Status OpString(uint8_t op) {
    const size_t width = (op == 0x8c || op == 'U' || op == 'C') ? 1 : (op == 0x8d ? 8 : 4);
    CKPT_ASSIGN_OR_RETURN(uint64_t n, ReadLe(width));
    CKPT_ASSIGN_OR_RETURN(std::string s, ReadBytes(n));
    PyRef v = MakeString(std::move(s));
    if (op == 'B' || op == 'C') v->kind = PyValue::Kind::kBytes;
    return Push(v);
  }

  Status OpNone(uint8_t) { return Push(MakeNone()); }

  // NEWTRUE, NEWFALSE.
  Status OpBool(uint8_t op) { return Push(MakeBool(op == 0x88)); }

  Status OpPop(uint8_t) { return Pop().status(); }

  Status OpPopMark(uint8_t) { return PopMark().status(); }

  // DUP: a copy, as a memo read, so no container is shared.
  Status OpDup(uint8_t) {
    CKPT_ASSIGN_OR_RETURN(PyRef * top, Top());
    CKPT_ASSIGN_OR_RETURN(PyRef v, Copy(*top, 0));
    return Push(std::move(v));
  }

  using OpHandler = Status (Unpickler::*)(uint8_t op);

  // The data subset read here, by opcode; nullptr for every other opcode.
  static const std::array<OpHandler, 256>& Handlers() {
    static const std::array<OpHandler, 256> table = [] {
      const std::pair<uint8_t, OpHandler> kOps[] = {
          {0x80, &Unpickler::OpProto},        // PROTO
          {0x95, &Unpickler::OpFrame},        // FRAME
          {'(', &Unpickler::OpMark},          // MARK
          {'.', &Unpickler::OpStop},          // STOP
          {'}', &Unpickler::OpEmpty},         // EMPTY_DICT
          {']', &Unpickler::OpEmpty},         // EMPTY_LIST
          {')', &Unpickler::OpEmpty},         // EMPTY_TUPLE
          {'t', &Unpickler::OpTuple},         // TUPLE
          {0x85, &Unpickler::OpTupleN},       // TUPLE1
          {0x86, &Unpickler::OpTupleN},       // TUPLE2
          {0x87, &Unpickler::OpTupleN},       // TUPLE3
          {'s', &Unpickler::OpSetItem},       // SETITEM
          {'u', &Unpickler::OpSetItems},      // SETITEMS
          {'a', &Unpickler::OpAppend},        // APPEND
          {'e', &Unpickler::OpAppends},       // APPENDS
          {'q', &Unpickler::OpPut},           // BINPUT
          {'r', &Unpickler::OpPut},           // LONG_BINPUT
          {0x94, &Unpickler::OpMemoize},      // MEMOIZE
          {'h', &Unpickler::OpGet},           // BINGET
          {'j', &Unpickler::OpGet},           // LONG_BINGET
          {'c', &Unpickler::OpGlobal},        // GLOBAL
          {0x93, &Unpickler::OpStackGlobal},  // STACK_GLOBAL
          {'Q', &Unpickler::OpPersistentId},  // BINPERSID
          {'R', &Unpickler::OpReduce},        // REDUCE
          {'b', &Unpickler::OpBuild},         // BUILD
          {'J', &Unpickler::OpBinInt},        // BININT
          {'K', &Unpickler::OpBinInt},        // BININT1
          {'M', &Unpickler::OpBinInt},        // BININT2
          {0x8a, &Unpickler::OpLong1},        // LONG1
          {'G', &Unpickler::OpBinFloat},      // BINFLOAT
          {'X', &Unpickler::OpString},        // BINUNICODE
          {0x8c, &Unpickler::OpString},       // SHORT_BINUNICODE
          {0x8d, &Unpickler::OpString},       // BINUNICODE8
          {'T', &Unpickler::OpString},        // BINSTRING
          {'U', &Unpickler::OpString},        // SHORT_BINSTRING
          {'B', &Unpickler::OpString},        // BINBYTES
          {'C', &Unpickler::OpString},        // SHORT_BINBYTES
          {'N', &Unpickler::OpNone},          // NONE
          {0x88, &Unpickler::OpBool},         // NEWTRUE
          {0x89, &Unpickler::OpBool},         // NEWFALSE
          {'0', &Unpickler::OpPop},           // POP
          {'1', &Unpickler::OpPopMark},       // POP_MARK
          {'2', &Unpickler::OpDup},           // DUP
      };
      std::array<OpHandler, 256> t{};
      for (const auto& [op, handler] : kOps) t[op] = handler;
      return t;
    }();
    return table;
  }

  // Runs the opcode `op` read at offset `at`.
  Status Step(uint8_t op, size_t at) {
    const OpHandler handler = Handlers()[op];
    if (handler == nullptr) {
      pos_ = at;
      return Bad("pickle opcode " + Hex2(op) + " is outside the data subset read here");
    }
    return (this->*handler)(op);
  }

  std::string_view p_;
  size_t pos_ = 0;
  bool stopped_ = false;
  size_t copied_ = 0;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PyRef> memo_;
  std::unordered_map<const PyValue*, DictIndex> dict_index_;
};

}  // namespace

const PyValue* PyValue::Get(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict) {
    if (k->kind == Kind::kString && k->s == key) return v.get();
  }
  return nullptr;
}

PyRef MakeNone() { return Make(PyValue::Kind::kNone); }
PyRef MakeBool(bool v) {
  PyRef r = Make(PyValue::Kind::kBool);
  r->b = v;
  return r;
}
PyRef MakeInt(int64_t v) {
  PyRef r = Make(PyValue::Kind::kInt);
  r->i = v;
  return r;
}
PyRef MakeFloat(double v) {
  PyRef r = Make(PyValue::Kind::kFloat);
  r->f = v;
  return r;
}
PyRef MakeString(std::string v) {
  PyRef r = Make(PyValue::Kind::kString);
  r->s = std::move(v);
  return r;
}
PyRef MakeList() { return Make(PyValue::Kind::kList); }
PyRef MakeTuple() { return Make(PyValue::Kind::kTuple); }
PyRef MakeDict() { return Make(PyValue::Kind::kDict); }
PyRef MakeTensor(format::DType dtype, std::vector<int64_t> shape, std::string data) {
  PyRef r = Make(PyValue::Kind::kTensor);
  r->dtype = dtype;
  r->shape = std::move(shape);
  r->data = std::move(data);
  return r;
}

void DictSet(PyValue* dict, PyRef key, PyRef value) {
  for (auto& [k, v] : dict->dict) {
    bool same = k->kind == key->kind && ((k->kind == PyValue::Kind::kString && k->s == key->s) ||
                                         (k->kind == PyValue::Kind::kInt && k->i == key->i));
    if (same) {
      v = std::move(value);
      return;
    }
  }
  dict->dict.emplace_back(std::move(key), std::move(value));
}

StatusOr<format::DType> StorageDType(std::string_view name) {
  using format::DType;
  static const std::pair<const char*, DType> kMap[] = {
      {"FloatStorage", DType::kF32}, {"DoubleStorage", DType::kF64},
      {"HalfStorage", DType::kF16},  {"BFloat16Storage", DType::kBF16},
      {"LongStorage", DType::kI64},  {"IntStorage", DType::kI32},
      {"ShortStorage", DType::kI16}, {"CharStorage", DType::kI8},
      {"ByteStorage", DType::kU8},   {"BoolStorage", DType::kBool},
  };
  for (const auto& [n, d] : kMap) {
    if (name == n) return d;
  }
  return Status::InvalidArgument("unknown storage type torch." + std::string(name));
}

StatusOr<PyRef> Unpickle(std::string_view pickle) { return Unpickler(pickle).Run(); }

namespace {

// Elements of `shape`; -1 above 2^40.
int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > (int64_t{1} << 40) / d) return -1;
    n *= d;
  }
  return n;
}

// What Fill copies into tensors, against its cap.
struct CopyBudget {
  uint64_t cap = 0;
  uint64_t used = 0;
};

Status Fill(PyValue* v, const StorageBytes& storage, const std::string& origin, int depth,
            CopyBudget* budget) {
  using K = PyValue::Kind;
  if (depth > kMaxPickleNesting)
    return Status::Corruption(origin + ": the saved object nests too deep");
  for (auto& x : v->items) {
    CKPT_RETURN_IF_ERROR(Fill(x.get(), storage, origin, depth + 1, budget));
  }
  // Keys too: a pickle may use a tensor as a dict key (torch hashes tensors
  // by identity), and a tensor left unfilled would have a shape and no data.
  for (auto& [k, x] : v->dict) {
    CKPT_RETURN_IF_ERROR(Fill(k.get(), storage, origin, depth + 1, budget));
    CKPT_RETURN_IF_ERROR(Fill(x.get(), storage, origin, depth + 1, budget));
  }
  if (v->kind != K::kTensor) return Status::OK();
  auto bytes = storage(v->storage_key);
  if (!bytes.ok()) {
    if (bytes.status().IsNotFound()) {
      return Status::Corruption(origin + ": storage record data/" + v->storage_key + " is missing");
    }
    return bytes.status();
  }
  const size_t elem = format::DTypeSize(v->dtype);
  const int64_t numel = Numel(v->shape);
  if (numel < 0 || v->shape.size() != v->stride.size()) {
    return Status::Corruption(origin + ": a tensor's size overflows");
  }
  // Contiguous row-major: stride[i] = product of the sizes after i. A tensor
  // without elements has no layout to check (and its sizes' product may not
  // fit in 64 bits).
  if (numel > 0) {
    int64_t expect = 1;
    for (size_t i = v->shape.size(); i-- > 0;) {
      if (v->shape[i] != 1 && v->stride[i] != expect) {
        return Status::Corruption(origin + ": tensor with storage " + v->storage_key +
                                  " is not contiguous (save it with .contiguous())");
      }
      expect *= v->shape[i];
    }
  }
  const size_t storage_elems = bytes->size() / elem;
  if (static_cast<uint64_t>(v->storage_offset) + static_cast<uint64_t>(numel) > storage_elems) {
    return Status::Corruption(origin + ": tensor with storage " + v->storage_key +
                              " reaches past its storage (" + std::to_string(storage_elems) +
                              " elements)");
  }
  const uint64_t copy = static_cast<uint64_t>(numel) * elem;
  if (copy > budget->cap - budget->used) {
    return Status::Corruption(origin + ": its tensors hold more than " +
                              std::to_string(budget->cap) +
                              " bytes together, the cap for this file (docs/LIMITS.md); tensor "
                              "with storage " +
                              v->storage_key + " passes it");
  }
  budget->used += copy;
  v->data.assign(bytes->data() + static_cast<size_t>(v->storage_offset) * elem,
                 static_cast<size_t>(copy));
  return Status::OK();
}

}  // namespace

Status FillTensorData(PyValue* root, const StorageBytes& storage, const std::string& origin,
                      uint64_t max_tensor_bytes) {
  if (root == nullptr) return Status::Corruption(origin + ": holds nothing");
  CopyBudget budget{max_tensor_bytes, 0};
  return Fill(root, storage, origin, 0, &budget);
}

}  // namespace ckpt::tool
