// Acceptance profiles (plan/profile.hpp): the derived figures against hand-computed answers, rates
// that rise (a curve measured at each k separately), the JSON file read back as written, and the
// files a reader refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error_of.hpp"
#include "common/temp_dir.hpp"
#include "plan/profile.hpp"

using namespace mtplab;
using namespace mtplab::plan;
using mtplab::test::error_of;
using mtplab::test::expect_has;

namespace {

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "at " << i;
}

AcceptanceProfile curve(std::vector<double> lengths) {
  AcceptanceProfile p;
  p.description = "a curve";
  p.accepted_length = std::move(lengths);
  return p;
}

}  // namespace

TEST(PlanProfile, DerivedFiguresOfOneChain) {
  // r = 0.8, 0.6, 0.3: tau(k) = 1.8, 2.4, 2.7.
  AcceptanceProfile p;
  p.marginal_rates = {0.8, 0.6, 0.3};
  EXPECT_EQ(p.k_max(), 3);
  EXPECT_NEAR(p.tau(2), 2.4, 1e-12);
  EXPECT_EQ(p.tau(0), 1);
  expect_near(p.conditional(), {0.8, 0.75, 0.5});
  // P(a = 0) = 0.2, P(1) = 0.2, P(2) = 0.3, P(3) = 0.3; sums to 1, mean 1.7 = tau(3) - 1.
  const std::vector<double> h = p.histogram();
  expect_near(h, {0.2, 0.2, 0.3, 0.3});
  double mean = 0;
  for (size_t j = 0; j < h.size(); ++j) mean += static_cast<double>(j) * h[j];
  EXPECT_NEAR(mean, p.tau(3) - 1, 1e-12);
  EXPECT_TRUE(p.monotonicity_notes().empty());
  // From accepted lengths: the marginal rates are the increments.
  const AcceptanceProfile c = curve({1.8, 2.4, 2.7});
  expect_near(c.marginal(), {0.8, 0.6, 0.3});
  EXPECT_NEAR(c.tau(3), 2.7, 1e-12);
}

TEST(PlanProfile, RisingRatesUseTheRunningMinimumAndSaySo) {
  // The published GLM-5.2 curve: increments 0.84 .. 0.13, 0.15 (the last one rises).
  const AcceptanceProfile p = curve({1.84, 2.50, 2.99, 3.33, 3.61, 3.78, 3.91, 4.06});
  expect_near(p.marginal(), {0.84, 0.66, 0.49, 0.34, 0.28, 0.17, 0.13, 0.15});
  expect_near(p.chain_marginal(), {0.84, 0.66, 0.49, 0.34, 0.28, 0.17, 0.13, 0.13});
  const std::vector<std::string> notes = p.monotonicity_notes();
  ASSERT_EQ(notes.size(), 1u);
  expect_has(notes[0], "marginal rate at position 8 (0.15) is above the rate at position 7 (0.13)");
  EXPECT_NEAR(p.histogram()[7], 0.0, 1e-12);  // P(a = 7) = r_7 - r_8 with the lowered r_8
  EXPECT_NEAR(p.conditional()[7], 1.0, 1e-12);
  EXPECT_NEAR(p.tau(8), 4.06, 1e-12);  // tau itself stays as measured
}

TEST(PlanProfile, JsonRoundTrip) {
  AcceptanceProfile p = curve({1.84, 2.50, 2.99, 3.33, 3.61, 3.78, 3.91, 4.06});
  p.source = "a \"quoted\" source\\path";
  p.accepted_length_ci = {{1.8, 1.9}, {2.4, 2.6}, {2.9, 3.1}, {3.2, 3.4},
                          {3.5, 3.7}, {3.7, 3.9}, {3.8, 4.0}, {4.0, 4.1}};
  const std::string text = profile_json(p);
  const AcceptanceProfile q = parse_profile(text, "p.json");
  EXPECT_EQ(q.description, p.description);
  EXPECT_EQ(q.source, p.source);
  EXPECT_EQ(q.accepted_length, p.accepted_length);
  EXPECT_EQ(q.accepted_length_ci, p.accepted_length_ci);
  expect_near(q.marginal(), p.marginal(), 1e-11);
  expect_near(q.conditional(), p.conditional(), 1e-11);
  expect_near(q.histogram(), p.histogram(), 1e-11);
  expect_near(q.chain_marginal(), p.chain_marginal(), 1e-11);
  // The note on the rising rate is written once and kept once on a second round.
  EXPECT_EQ(q.notes.size(), 1u);
  EXPECT_EQ(profile_json(q), text);
  expect_has(text, "\"vllm_synthetic_acceptance_rates\": [0.84, 0.66, 0.49, 0.34, 0.28, 0.17, 0.13, 0.13]");
  // A file on disk reads the same.
  test::TempDir dir("mtplab-plan-profile");
  const std::string path = dir / "p.json";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  EXPECT_EQ(read_profile(path).accepted_length, p.accepted_length);
}

TEST(PlanProfile, RefusedFilesNameTheKey) {
  const std::string head = "{\"schema\": \"mtplab-acceptance-profile\", \"schema_version\": 1, ";
  expect_has(error_of([&] { parse_profile(head + "\"accepted_lenght\": [1.5]}", "a.json"); }), "a.json:1:");
  expect_has(error_of([&] { parse_profile(head + "\"accepted_lenght\": [1.5]}", "a.json"); }),
             "unknown key \"accepted_lenght\" in an acceptance profile (did you mean \"accepted_length\"?)");
  expect_has(
      error_of([&] { parse_profile("{\"schema\": \"other\", \"accepted_length\": [1.5]}", "b.json"); }),
      "b.json: not an acceptance profile");
  expect_has(error_of([&] { parse_profile(head + "\"accepted_length\": [1.5, 3.7]}", "c.json"); }),
             "c.json: accepted_length[1] = 3.7 at k = 2 is outside [1, 3]");
  expect_has(error_of([&] { parse_profile(head + "\"accepted_length\": [1.8, 1.7]}", "d.json"); }),
             "is below the length at k = 1");
  expect_has(error_of([&] { parse_profile(head + "\"marginal_rates\": [0.5, 1.2]}", "e.json"); }),
             "e.json: marginal_rates[1] = 1.2 is outside [0, 1]");
  // A derived key that disagrees with the primary figures.
  expect_has(error_of([&] {
               parse_profile(head + "\"marginal_rates\": [0.8, 0.4], \"conditional_rates\": [0.8, 0.6]}",
                             "f.json");
             }),
             "f.json:1:");
  expect_has(error_of([&] {
               parse_profile(head + "\"marginal_rates\": [0.8, 0.4], \"conditional_rates\": [0.8, 0.6]}",
                             "f.json");
             }),
             "conditional_rates[1] = 0.6 disagrees with the value the profile's primary figures give (0.5)");
  expect_has(error_of([&] { parse_profile(head + "\"k_max\": 1}", "g.json"); }),
             "g.json: the profile holds neither accepted_length nor marginal_rates");
  expect_has(error_of([&] { parse_profile(head + "\"accepted_length\": [1.5,]}", "h.json"); }), "h.json:1:");
}
