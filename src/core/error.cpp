#include "vflow/core/error.h"

#include <fmt/format.h>

namespace vflow {

void internal_assert_failed(const char* condition, const char* file, int line,
                            const std::string& message) {
  throw InternalError(fmt::format("internal error at {}:{}: ({}) {} -- this is a bug in vflow",
                                  file, line, condition, message));
}

}  // namespace vflow
