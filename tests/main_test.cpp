#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  // Every napkin a test starts sees the built-in device table, never the
  // developer's own measured ~/.config/napkin/devices.json (napkin devices
  // --measure), which would change every report; tests of the local device
  // file set NAPKIN_DEVICES themselves.
  setenv("NAPKIN_DEVICES", "", 1);
  return doctest::Context(argc, argv).run();
}
