// JSON encodings of the store's values (experiments, heads, manifests, events).
// The decoders treat stored bytes as untrusted and return Corruption naming
// the record; nlohmann exceptions never leave codec.cc.
//
// Thread-safety: pure functions.
#ifndef CKPT_STORE_SRC_CODEC_H_
#define CKPT_STORE_SRC_CODEC_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"
#include "ckpt/store/store.h"

namespace ckpt::store::codec {

int64_t NowUnixMs();

// Experiment value: {"config": "<verbatim JSON text>", "status": ..., "created_unix_ms": ...}.
std::string EncodeExperiment(const ExperimentInfo& info);
StatusOr<ExperimentInfo> DecodeExperiment(std::string_view id, std::string_view value);

// Head value: {"version", "state", "last_score" (null = NaN), "hparams", "step",
// "blob" (32 hex or null), "updated_unix_ms"}. The member id comes from the key.
std::string EncodeHead(const MemberHead& head);
StatusOr<MemberHead> DecodeHead(std::string_view member, std::string_view value);

// Manifest value: {"version", "blob", "bytes", "step", "metrics", "hparams",
// "parent" ({"member","version"} or null), "reason", "unix_ms", "pinned",
// "holds_blob"}. Non-finite doubles are stored as null and read back as NaN.
std::string EncodeManifest(const Manifest& m);
StatusOr<Manifest> DecodeManifest(std::string_view member, std::string_view value);

// InvalidArgument unless `text` is valid JSON.
Status ValidateJson(std::string_view what, std::string_view text);

// Builds a stored event from the caller's JSON object (empty: {}): sets
// "type" to `default_type` when absent, then `fields` (overwriting), "exp" and
// "unix_ms". InvalidArgument when `text` is neither empty nor a JSON object.
StatusOr<std::string> BuildEvent(std::string_view text, std::string_view default_type,
                                 std::string_view exp,
                                 const std::map<std::string, std::string>& string_fields,
                                 const std::map<std::string, int64_t>& int_fields);

}  // namespace ckpt::store::codec

#endif  // CKPT_STORE_SRC_CODEC_H_
