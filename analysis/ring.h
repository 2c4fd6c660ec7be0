// A fixed-capacity ring buffer: the bounded per-rank and per-job history of the engine.
#pragma once

#include <cstddef>
#include <vector>

#include "common/check.h"

namespace stepwatch::analysis {

template <typename T>
class Ring {
 public:
  // A ring of capacity 0 (the default) holds nothing until it is replaced by a real one.
  explicit Ring(size_t capacity = 0) : buf_(capacity) {}

  size_t capacity() const { return buf_.size(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool full() const { return size_ == buf_.size(); }

  // Appends `value`; when full, the oldest element is dropped and returned through `evicted`.
  bool Push(const T& value, T* evicted = nullptr) {
    if (buf_.empty()) return false;
    bool dropped = false;
    if (full()) {
      if (evicted != nullptr) *evicted = buf_[head_];
      dropped = true;
      buf_[head_] = value;
      head_ = (head_ + 1) % buf_.size();
    } else {
      buf_[(head_ + size_) % buf_.size()] = value;
      ++size_;
    }
    return dropped;
  }

  // i = 0 is the oldest element; i < size(). Hot: checked in debug builds only.
  const T& operator[](size_t i) const {
    SW_DCHECK(i < size_) << "index " << i << " of " << size_;
    return buf_[(head_ + i) % buf_.size()];
  }
  T& operator[](size_t i) {
    SW_DCHECK(i < size_) << "index " << i << " of " << size_;
    return buf_[(head_ + i) % buf_.size()];
  }
  const T& back() const {
    SW_DCHECK(size_ > 0);
    return (*this)[size_ - 1];
  }

  void Clear() {
    head_ = 0;
    size_ = 0;
  }

 private:
  std::vector<T> buf_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace stepwatch::analysis
