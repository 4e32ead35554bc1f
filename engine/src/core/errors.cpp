#include <fmt/format.h>

#include "normjit/normjit.hpp"

namespace normjit {

namespace {
std::string compose(const std::string& message, const std::string& op, const std::string& shape,
                    const std::string& config, const std::string& where) {
  std::string s = "normjit: " + message;
  if (!op.empty()) s += fmt::format(" [op {}]", op);
  if (!shape.empty()) s += fmt::format(" [shape {}]", shape);
  if (!config.empty()) s += fmt::format(" [config {}]", config);
  if (!where.empty()) s += fmt::format(" (at {})", where);
  return s;
}
}  // namespace

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::InvalidArgument: return "invalid argument";
    case ErrorKind::LibraryNotFound: return "library not found";
    case ErrorKind::NoDevice: return "no device";
    case ErrorKind::Driver: return "driver error";
    case ErrorKind::Compile: return "compile error";
    case ErrorKind::Cache: return "cache error";
    case ErrorKind::Tuning: return "tuning error";
  }
  return "error";
}

Error::Error(ErrorKind kind, std::string message, std::string op, std::string shape,
             std::string config, std::string where)
    : std::runtime_error(compose(message, op, shape, config, where)),
      kind_(kind),
      message_(std::move(message)),
      op_(std::move(op)),
      shape_(std::move(shape)),
      config_(std::move(config)),
      where_(std::move(where)) {}

CompileError::CompileError(std::string message, std::string log, std::vector<std::string> options,
                           std::string kernel_name, std::string arch, std::string where)
    : Error(ErrorKind::Compile,
            fmt::format("{} (kernel {}, arch {}, options: {})\n{}", message, kernel_name, arch,
                        fmt::join(options, " "), log),
            {}, {}, {}, std::move(where)),
      log_(std::move(log)),
      options_(std::move(options)),
      kernel_name_(std::move(kernel_name)),
      arch_(std::move(arch)) {}

}  // namespace normjit
