#include "transport/ring/loan_ledger.h"

namespace sparsereduce::transport {

void LoanLedger::Lend(uint64_t begin) {
  loans_.push_back(Loan{begin, false});
  ++outstanding_;
}

bool LoanLedger::Return(uint64_t offset, uint64_t capacity) {
  for (Loan& loan : loans_) {
    if (loan.returned || loan.begin % capacity != offset) continue;
    loan.returned = true;
    --outstanding_;
    while (!loans_.empty() && loans_.front().returned) loans_.pop_front();
    return true;
  }
  return false;
}

}  // namespace sparsereduce::transport
