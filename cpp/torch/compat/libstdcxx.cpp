// Three libstdc++ functions that GCC 11's headers call and that only a newer libstdc++ exports (GLIBCXX_3.4.29,
// CXXABI_1.3.13), defined here for the wheels of a torch built with the pre-C++11 ABI (torch 2.6), whose libraries
// must use the system's libstdc++ (cpp/torch/CMakeLists.txt) on systems as old as manylinux_2_28 (GLIBCXX_3.4.24).
// Linked in as a static library whose symbols are hidden, so they serve this library only; each keeps the
// meaning of the libstdc++ function it stands in for, through functions every libstdc++ since GCC 4.4 exports.
#include <exception>
#include <new>

// exception_ptr's copy constructor and destructor as GCC < 11 called them (out of line, CXXABI_1.3.3): the first
// takes a reference to the other's exception, the second drops this one's.
extern "C" void opbridge_exception_ptr_copy(void* self, const void* other) noexcept;
extern "C" void opbridge_exception_ptr_destroy(void* self) noexcept;
__asm__(".symver opbridge_exception_ptr_copy,_ZNSt15__exception_ptr13exception_ptrC1ERKS0_@CXXABI_1.3.3");
__asm__(".symver opbridge_exception_ptr_destroy,_ZNSt15__exception_ptr13exception_ptrD1Ev@CXXABI_1.3.3");

namespace std {

void __throw_bad_array_new_length() { throw bad_array_new_length(); }

namespace __exception_ptr {

// One more reference to the exception: a copy made by the old constructor and never destroyed.
void exception_ptr::_M_addref() noexcept {
  void* reference = nullptr;
  opbridge_exception_ptr_copy(&reference, this);
}

// One reference fewer: the old destructor run on a copy of the pointer.
void exception_ptr::_M_release() noexcept {
  void* reference = _M_exception_object;
  opbridge_exception_ptr_destroy(&reference);
}

}  // namespace __exception_ptr
}  // namespace std
