// How vflow's command-line programs parse their flags and end on an error: every app
// maps the same exceptions to the same codes of vflow/core/exit_code.h.
#pragma once

#include <CLI/CLI.hpp>
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <string>

#include "vflow/core/error.h"
#include "vflow/core/exit_code.h"

namespace vflow::apps {

/// Parses the command line. Returns -1 to go on, or the code to exit with: 0 after
/// --help, kExitUsage (with CLI11's message and a pointer to --help) for a bad flag.
inline int parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << e.what() << "\nRun with --help for more information.\n";
    return kExitUsage;
  }
  return -1;
}

/// A flag validator: an integer of at least `min` (and at most `max`), with a message that
/// says what is allowed, e.g. "--workers: must be at least 1, got 0".
inline CLI::Validator at_least(long long min,
                               long long max = std::numeric_limits<long long>::max()) {
  return CLI::Validator(
      [min, max](std::string& value) -> std::string {
        long long v = 0;
        size_t used = 0;
        try {
          v = std::stoll(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != value.size())
          return "expected a whole number, got '" + value + "'";
        if (v < min) return "must be at least " + std::to_string(min) + ", got " + value;
        if (v > max) return "must be at most " + std::to_string(max) + ", got " + value;
        return "";
      },
      max == std::numeric_limits<long long>::max()
          ? ">= " + std::to_string(min)
          : std::to_string(min) + ".." + std::to_string(max));
}

/// A positive number of seconds (or any positive real), e.g. for --timeout.
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = std::stod(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != value.size() || !(v > 0) || v > 1e12) {
          return "must be a positive number, got '" + value + "'";
        }
        return "";
      },
      "> 0");
}

/// A TCP port; 0 asks for any free one.
inline CLI::Validator tcp_port() {
  return at_least(0, 65535).description("PORT (0..65535; 0 = any free port)");
}

/// Runs `body` and maps what it throws to the exit-code table, with the message on stderr.
inline int run_reporting_errors(const std::function<int()>& body) {
  try {
    return body();
  } catch (const SpecError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitUsage;
  } catch (const DataError& e) {
    std::cerr << "data error: " << e.what() << "\n";
    return kExitBadData;
  } catch (const CheckpointError& e) {
    std::cerr << "checkpoint error: " << e.what() << "\n";
    return kExitCheckpoint;
  } catch (const PeerFailure& e) {
    std::cerr << "peer failure: " << e.what() << "\n";
    return kExitPeerFailure;
  } catch (const RequestRefused& e) {
    std::cerr << "refused: " << e.what() << "\n";
    return kExitRefused;
  } catch (const OutOfMemory& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitOutOfMemory;
  } catch (const Mismatch& e) {
    std::cerr << "mismatch: " << e.what() << "\n";
    return kExitMismatch;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace vflow::apps
