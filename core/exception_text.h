// What escaped a coroutine, as text. The daemon's and the worker's coroutines report their errors as Status values;
// an exception that escapes one anyway (std::bad_alloc, a bug) would end it silently under asio::detached, leaving
// its connection open and its job waiting for a timeout. Their co_spawn completion handlers log it with this text
// and end the connection, or the worker, with an INTERNAL error instead.
#pragma once

#include <exception>
#include <string>

namespace sparsereduce {

// The what() of the exception `error` holds, or a placeholder for one that is not a std::exception.
inline std::string ExceptionText(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace sparsereduce
