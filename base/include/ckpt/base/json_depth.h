// Nesting depth of JSON text, measured before a JSON parser sees it: parsers
// recurse per level, so a reader of untrusted JSON (the control socket, ring
// messages) refuses text nested deeper than it allows.
//
// Thread-safety: pure function.
#ifndef CKPT_BASE_JSON_DEPTH_H_
#define CKPT_BASE_JSON_DEPTH_H_

#include <string_view>

namespace ckpt::base {

// The depth of the deepest array or object in `text` (0 for a scalar; `[]`
// is 1, `{"a":[1]}` is 2), counting brackets outside strings (escapes inside
// strings respected). Stops reading once the depth passes `limit` and returns
// limit + 1, so a reader refuses the text when the result is > limit. The text
// need not be valid JSON: the parser that follows reports that.
int JsonDepth(std::string_view text, int limit);

}  // namespace ckpt::base

#endif  // CKPT_BASE_JSON_DEPTH_H_
