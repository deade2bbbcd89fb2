// The Tokenizer members json_constraint.cc links against, empty: the fuzz driver builds no token table.
#include "petrel/text/tokenizer.h"
namespace petrel {
int32_t Tokenizer::vocab_size() const { return 0; }
bool Tokenizer::is_special(int32_t) const { return false; }
std::optional<std::string> Tokenizer::token_bytes(int32_t) const { return {}; }
}
