#include "safetensors_header.h"

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

namespace ckpt::format::internal {
namespace {

using json = nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";

// nlohmann's SAX interface. Each value arrives as a scalar event or as the
// start of an array or object; where it lands depends on the container it is
// in (the frame on top of the stack) and that container's current key.
class HeaderSax {
 public:
  explicit HeaderSax(SafetensorsHeader* out) : out_(out) {}

  bool null() { return Scalar(Value::kOther); }
  bool boolean(bool /*v*/) { return Scalar(Value::kOther); }
  bool number_integer(json::number_integer_t /*v*/) { return Scalar(Value::kOther); }
  bool number_unsigned(json::number_unsigned_t v) { return Scalar(Value::kNatural, v); }
  bool number_float(json::number_float_t /*v*/, const json::string_t& /*text*/) {
    return Scalar(Value::kOther);
  }
  bool binary(json::binary_t& /*v*/) { return Scalar(Value::kOther); }
  bool string(json::string_t& s) { return Scalar(Value::kString, 0, &s); }

  bool start_object(std::size_t /*elements*/) {
    frames_.push_back(Place(Value::kObject));
    return true;
  }
  bool start_array(std::size_t /*elements*/) {
    frames_.push_back(Place(Value::kArray));
    return true;
  }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(json::string_t& k) {
    // Only the keys of the top object, of __metadata__ and of a tensor's
    // object are read; each frame's key is set before its value arrives.
    if (Top() == Frame::kTop) {
      top_key_ = std::move(k);
    } else if (Top() == Frame::kMetadata || Top() == Frame::kTensor) {
      key_ = std::move(k);
    }
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*token*/,
                   const nlohmann::detail::exception& /*e*/) {
    return false;
  }

 private:
  enum class Frame { kNone, kTop, kMetadata, kTensor, kField, kSkipped };
  enum class Value { kNatural, kString, kOther, kArray, kObject };  // kOther: another scalar

  Frame Top() const { return frames_.empty() ? Frame::kNone : frames_.back(); }

  HeaderField* Field() {
    if (key_ == "dtype") return &entry_->dtype;
    if (key_ == "shape") return &entry_->shape;
    if (key_ == "data_offsets") return &entry_->data_offsets;
    return nullptr;  // another key: skipped
  }

  // A value in the top object: "__metadata__" or a tensor's entry, each
  // replacing an earlier one of the same key.
  void TopValue(bool object) {
    if (top_key_ == kMetadataKey) {
      out_->has_metadata = true;
      out_->metadata_is_object = object;
      out_->metadata.clear();
    } else {
      entry_ = &out_->entries[top_key_];
      *entry_ = HeaderEntry{};
      entry_->is_object = object;
    }
  }

  bool Scalar(Value v, uint64_t natural = 0, json::string_t* text = nullptr) {
    Place(v, natural, text);
    return true;
  }

  // Places a value (a scalar, or the start of an array or object) in its
  // container. Returns the frame of the value's own contents.
  Frame Place(Value v, uint64_t natural = 0, json::string_t* text = nullptr) {
    const bool object = v == Value::kObject;
    switch (Top()) {
      case Frame::kNone:
        out_->is_object = object;
        return object ? Frame::kTop : Frame::kSkipped;
      case Frame::kTop:
        TopValue(object);
        if (!object) return Frame::kSkipped;
        return top_key_ == kMetadataKey ? Frame::kMetadata : Frame::kTensor;
      case Frame::kMetadata:
        if (v == Value::kString) {
          out_->metadata[key_] = std::move(*text);
        } else {
          out_->metadata[key_] = std::nullopt;
        }
        return Frame::kSkipped;
      case Frame::kTensor:
        if (HeaderField* f = Field()) {
          *f = HeaderField{};
          if (v == Value::kString) {
            f->kind = HeaderField::Kind::kString;
            f->text = std::move(*text);
          } else if (v == Value::kArray) {
            f->kind = HeaderField::Kind::kArray;
            field_ = f;
            return Frame::kField;
          } else {
            f->kind = HeaderField::Kind::kOther;
          }
        }
        return Frame::kSkipped;
      case Frame::kField:
        if (++field_->count <= kKeptItems) {
          field_->items.push_back(v == Value::kNatural ? std::optional<uint64_t>(natural)
                                                       : std::nullopt);
        }
        return Frame::kSkipped;
      case Frame::kSkipped:
        return Frame::kSkipped;
    }
    return Frame::kSkipped;
  }

  bool Close() {
    frames_.pop_back();
    return true;
  }

  SafetensorsHeader* out_;
  std::vector<Frame> frames_;
  std::string top_key_;           // the top object's current key
  std::string key_;               // __metadata__'s or the tensor object's current key
  HeaderEntry* entry_ = nullptr;  // the tensor object being read
  HeaderField* field_ = nullptr;  // the field array being read
};

}  // namespace

bool ParseSafetensorsHeader(const uint8_t* begin, const uint8_t* end, SafetensorsHeader* out) {
  *out = SafetensorsHeader{};
  HeaderSax sax(out);
  return json::sax_parse(begin, end, &sax);
}

}  // namespace ckpt::format::internal
