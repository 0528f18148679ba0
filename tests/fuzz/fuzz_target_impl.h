// Template part of fuzz_target.h.
#pragma once

#include <exception>

#include "vflow/core/error.h"

namespace vflow::fuzz {

template <typename Body>
std::string expect_clean_refusal(Body&& body, const std::string& expected_prefix) {
  try {
    body();
    return "";
  } catch (const InternalError& e) {
    finding(std::string("internal error: ") + e.what());
  } catch (const Error& e) {
    const std::string message = e.what();
    if (message.empty()) finding("a vflow::Error without a message");
    if (!expected_prefix.empty() && message.rfind(expected_prefix, 0) != 0) {
      finding("an error that does not name its input (" + expected_prefix + "): " + message);
    }
    return message;
  } catch (const std::exception& e) {
    finding(std::string("an exception that is not a vflow::Error: ") + e.what());
  } catch (...) {
    finding("an exception of unknown type");
  }
  return "";
}

}  // namespace vflow::fuzz
