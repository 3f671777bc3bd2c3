/* How many cases a randomized test runs: all of them in the plain build; a
 * fifth under the sanitizers, which run each 5-20 times slower and look for
 * memory errors, not for the rare interleaving the plain build's cases are
 * there to find (make test's 10-minute budget on a 2-core machine). */
#ifndef GML_TESTS_ROUNDS_H
#define GML_TESTS_ROUNDS_H
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ROUNDS(n) ((n) / 5 > 0 ? (n) / 5 : 1)
#else
#define TEST_ROUNDS(n) (n)
#endif
#endif
