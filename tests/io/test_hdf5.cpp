// The HDF5 wrapper: round trips of every attribute and dataset type, chunking and deflate,
// appends, slabs, atomic create / append, and clear errors on truncated or foreign files.
// Every value is drawn at random and compared bit for bit: nothing is converted on the way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/temp_files.hpp"
#include "io/hdf5.hpp"
#include "io_test_util.hpp"

using namespace mtplab;
using namespace mtplab::io;
using mtplab::io::testing_util::error_of;

namespace {

class Hdf5Test : public testing_util::TempDirTest {
 protected:
  template <typename T>
  std::vector<T> random_values(std::size_t n) {
    std::vector<T> v(n);
    for (auto& x : v) {
      if constexpr (std::is_same_v<T, bf16>) {
        x = to_bf16(std::normal_distribution<float>(0.0f, 3.0f)(rng_));
      } else if constexpr (std::is_floating_point_v<T>) {
        x = std::normal_distribution<T>(0, 1e3)(rng_);
      } else {
        x = static_cast<T>(std::uniform_int_distribution<std::int64_t>(std::numeric_limits<T>::min(),
                                                                       std::numeric_limits<T>::max())(rng_));
      }
    }
    return v;
  }
  std::string random_string(std::size_t n) {
    std::string s(n, ' ');
    for (auto& c : s) c = static_cast<char>(std::uniform_int_distribution<int>(32, 126)(rng_));
    return s;
  }
};

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

std::uintmax_t file_size(const std::string& p) { return std::filesystem::file_size(p); }

}  // namespace

// ---- attributes ------------------------------------------------------------------------------

TEST_F(Hdf5Test, AttributesRoundTripOnFileGroupAndDataset) {
  const std::string path = file("attrs.h5");
  const auto i = static_cast<std::int64_t>(rng_());
  const double d = std::normal_distribution<double>(0, 1e6)(rng_);
  const std::string s = random_string(40) + " \xc3\xa9\xe2\x82\xac";  // UTF-8 passes through
  const std::string big = random_string(200000);                      // over the 64 KiB object-header limit
  const auto ints = random_values<std::int64_t>(17);
  const auto doubles = random_values<double>(9);
  std::vector<std::string> strings = {random_string(3), "", random_string(100)};
  {
    H5File f = H5File::create(path);
    Group g = f.create_group("grp");
    Dataset ds = g.write("ds", random_values<float>(5));
    for (Object* o : std::initializer_list<Object*>{&f, &g, &ds}) {
      o->set_attr("i", i);
      o->set_attr("d", d);
      o->set_attr("s", s);
      o->set_attr("big", big);
      o->set_attr("ints", ints);
      o->set_attr("doubles", doubles);
      o->set_attr("strings", strings);
      o->set_attr("empty_ints", std::vector<std::int64_t>{});
      o->set_attr("flag", true);
      o->set_attr("small_int", 7);  // int goes through the integral template
      o->set_attr("unsigned", std::uint64_t{1} << 40);
      o->set_attr("replaced", "a string first");
      o->set_attr("replaced", 2.5);  // a new type replaces the old attribute
    }
    f.commit();
  }
  H5File f = H5File::open_read(path);
  const Group g = f.open_group("grp");
  const Dataset ds = g.open_dataset("ds");
  for (const Object* o : std::initializer_list<const Object*>{&f, &g, &ds}) {
    SCOPED_TRACE(o->path());
    EXPECT_EQ(o->attr_int("i"), i);
    EXPECT_EQ(o->attr_double("d"), d);  // exact: stored as float64
    EXPECT_EQ(o->attr_string("s"), s);
    EXPECT_EQ(o->attr_string("big"), big);
    EXPECT_EQ(o->attr_ints("ints"), ints);
    EXPECT_EQ(o->attr_doubles("doubles"), doubles);
    EXPECT_EQ(o->attr_strings("strings"), strings);
    EXPECT_TRUE(o->attr_ints("empty_ints").empty());
    EXPECT_EQ(o->attr_int("flag"), 1);
    EXPECT_EQ(o->attr_int("small_int"), 7);
    EXPECT_EQ(o->attr_int("unsigned"), std::int64_t{1} << 40);
    EXPECT_EQ(o->attr_double("replaced"), 2.5);
    EXPECT_EQ(o->attr_ints("i"), std::vector<std::int64_t>{i});  // a scalar reads as one element
    const AttrInfo info = o->attr_info("strings");
    EXPECT_EQ(info.kind, AttrKind::string);
    EXPECT_FALSE(info.scalar);
    EXPECT_EQ(info.size, 3u);
    EXPECT_TRUE(o->has_attr("d"));
    EXPECT_FALSE(o->has_attr("nope"));
  }
  // Creation order, not name order ("replaced" was re-created last).
  const std::vector<std::string> order = {"i",    "d",         "s",        "big",
                                          "ints", "doubles",   "strings",  "empty_ints",
                                          "flag", "small_int", "unsigned", "replaced"};
  EXPECT_EQ(g.attr_names(), order);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(ds.path(), "/grp/ds");
}

TEST_F(Hdf5Test, AttributeReadsCheckTheType) {
  const std::string path = file("types.h5");
  H5File f = H5File::create(path);
  Group g = f.create_group("g");
  g.set_attr("an_int", std::int64_t{3});
  g.set_attr("a_double", 3.0);
  g.set_attr("a_string", "3");
  g.set_attr("ints", std::vector<std::int64_t>{1, 2});

  std::string m = error_of([&] { (void)g.attr_double("an_int"); });
  EXPECT_NE(m.find(path), std::string::npos) << m;
  EXPECT_NE(m.find("/g"), std::string::npos) << m;
  EXPECT_NE(m.find("'an_int' is an integer"), std::string::npos) << m;
  m = error_of([&] { (void)g.attr_int("a_double"); });
  EXPECT_NE(m.find("'a_double' is a float"), std::string::npos) << m;
  m = error_of([&] { (void)g.attr_string("an_int"); });
  EXPECT_NE(m.find("not a string"), std::string::npos) << m;
  m = error_of([&] { (void)g.attr_int("a_string"); });
  EXPECT_NE(m.find("is a string"), std::string::npos) << m;
  m = error_of([&] { (void)g.attr_int("ints"); });
  EXPECT_NE(m.find("array of 2, not a scalar"), std::string::npos) << m;
  m = error_of([&] { (void)g.attr_int("missing"); });
  EXPECT_NE(m.find("no attribute 'missing'"), std::string::npos) << m;
  m = error_of([&] { g.set_attr("huge", std::uint64_t{1} << 63); });
  EXPECT_NE(m.find("does not fit in int64"), std::string::npos) << m;
  m = error_of([&] { g.set_attr("nul", std::string("a\0b", 3)); });
  EXPECT_NE(m.find("NUL"), std::string::npos) << m;
}

// ---- datasets --------------------------------------------------------------------------------

template <typename T>
class Hdf5TypedTest : public Hdf5Test {};
using ElementTypes = ::testing::Types<std::int8_t, std::uint8_t, std::uint16_t, std::int32_t, std::int64_t,
                                      float, double, bf16>;
TYPED_TEST_SUITE(Hdf5TypedTest, ElementTypes);

TYPED_TEST(Hdf5TypedTest, OneAndTwoDimensionalRoundTripWithAndWithoutDeflate) {
  using T = TypeParam;
  const std::string path = this->file("typed.h5");
  const std::uint64_t rows = 37 + this->rng_() % 50, cols = 1 + this->rng_() % 20;
  const auto flat = this->template random_values<T>(rows);
  const auto matrix = this->template random_values<T>(rows * cols);
  DatasetOptions packed;
  packed.deflate = 6;
  packed.chunk = {8, cols};  // rows do not divide by 8: the last chunk is partial
  DatasetOptions packed_1d = packed;
  packed_1d.chunk = {8};
  {
    H5File f = H5File::create(path);
    f.write("flat", flat);
    f.write("flat_z", flat, packed_1d);
    f.write("matrix", matrix, rows, cols);
    f.write("matrix_z", matrix, rows, cols, packed);
    f.commit();
  }
  H5File f = H5File::open_read(path);
  for (const char* name : {"flat", "flat_z"}) {
    SCOPED_TRACE(name);
    const Dataset d = f.open_dataset(name);
    EXPECT_EQ(d.dtype(), DTypeOf<T>::value);
    EXPECT_EQ(d.rank(), 1);
    EXPECT_EQ(d.shape(), std::vector<std::uint64_t>{rows});
    EXPECT_TRUE(same_bits(d.template read<T>(), flat));
  }
  for (const char* name : {"matrix", "matrix_z"}) {
    SCOPED_TRACE(name);
    const Dataset d = f.open_dataset(name);
    EXPECT_EQ(d.rank(), 2);
    EXPECT_EQ(d.shape(), (std::vector<std::uint64_t>{rows, cols}));
    EXPECT_TRUE(same_bits(d.template read<T>(), matrix));
    // A slab across chunk boundaries: rows [first, first + count).
    const std::uint64_t first = 3 + this->rng_() % 10, count = 9 + this->rng_() % 15;
    std::vector<T> want(matrix.begin() + static_cast<std::ptrdiff_t>(first * cols),
                        matrix.begin() + static_cast<std::ptrdiff_t>((first + count) * cols));
    EXPECT_TRUE(same_bits(d.template read_rows<T>(first, count), want));
  }
}

TEST_F(Hdf5Test, DeflateShrinksCompressibleData) {
  // A slowly varying ramp compresses well; if deflate were silently off the sizes would match.
  std::vector<std::int32_t> ramp(1 << 16);
  const auto start = static_cast<std::int32_t>(rng_() % 1000);
  for (std::size_t k = 0; k < ramp.size(); ++k) ramp[k] = start + static_cast<std::int32_t>(k / 64);
  DatasetOptions z;
  z.deflate = 6;
  for (const bool compress : {false, true}) {
    H5File f = H5File::create(file(compress ? "z.h5" : "plain.h5"));
    f.write("ramp", ramp, compress ? z : DatasetOptions{});
    f.commit();
  }
  EXPECT_LT(file_size(file("z.h5")) * 4, file_size(file("plain.h5")));
  EXPECT_EQ(H5File::open_read(file("z.h5")).open_dataset("ramp").read<std::int32_t>(), ramp);
}

TEST_F(Hdf5Test, ExtendableDatasetsAppendRows) {
  const std::string path = file("append.h5");
  const std::uint64_t cols = 2 + rng_() % 30;  // >= 2, so cols + 1 values are never whole rows
  std::vector<double> all;
  std::vector<std::string> labels;
  {
    H5File f = H5File::create(path);
    DatasetOptions grow;
    grow.extendable = true;
    grow.deflate = 1;
    Dataset d = f.create_dataset("steps/latency", DType::f64, 0, cols, grow);
    DatasetOptions labels_opts = grow;
    labels_opts.string_width = 32;
    Dataset s = f.write_strings("steps/label", {}, labels_opts);
    for (int batch = 0; batch < 7; ++batch) {
      const auto more = random_values<double>(cols * (rng_() % 40));  // sometimes zero rows
      d.append_rows(more);
      all.insert(all.end(), more.begin(), more.end());
      std::vector<std::string> l = {random_string(5), random_string(rng_() % 30)};
      s.append_strings(l);
      labels.insert(labels.end(), l.begin(), l.end());
    }
    EXPECT_TRUE(d.extendable());
    EXPECT_EQ(d.rows() * cols, all.size());
    std::string m = error_of([&] { d.append_rows(std::vector<double>(cols + 1, 1.0)); });
    EXPECT_NE(m.find("not whole rows"), std::string::npos) << m;
    m = error_of([&] { d.append_rows(std::vector<float>(cols, 1.0f)); });
    EXPECT_NE(m.find("holds float64, cannot write float32"), std::string::npos) << m;
    EXPECT_EQ(d.rows() * cols, all.size());  // refused appends added no rows
    m = error_of([&] { s.append_strings(std::vector<std::string>{"ok", random_string(33)}); });
    EXPECT_NE(m.find("33 bytes does not fit the fixed width 32"), std::string::npos) << m;
    EXPECT_EQ(s.rows(), labels.size());
    Dataset fixed = f.write("fixed", random_values<std::int32_t>(4));
    m = error_of([&] { fixed.append_rows(random_values<std::int32_t>(1)); });
    EXPECT_NE(m.find("/fixed: is not extendable"), std::string::npos) << m;
    f.commit();
  }
  H5File f = H5File::open_read(path);
  const Dataset d = f.open_group("steps").open_dataset("latency");
  EXPECT_TRUE(same_bits(d.read<double>(), all));
  EXPECT_EQ(f.open_dataset("steps/label").read_strings(), labels);
  const std::string m = error_of([&] { (void)d.read_rows<double>(d.rows() - 1, 2); });
  EXPECT_NE(m.find("/steps/latency"), std::string::npos) << m;
  EXPECT_NE(m.find("requested, the dataset has"), std::string::npos) << m;
}

TEST_F(Hdf5Test, OverwriteRowsInPlace) {
  H5File f = H5File::create(file("rows.h5"));
  auto v = random_values<std::int64_t>(6 * 4);
  Dataset d = f.write("m", v, 6, 4);
  const auto patch = random_values<std::int64_t>(2 * 4);
  d.write_rows(3, std::span<const std::int64_t>(patch));
  std::copy(patch.begin(), patch.end(), v.begin() + 3 * 4);
  EXPECT_EQ(d.read<std::int64_t>(), v);
  const std::string m = error_of([&] { d.write_rows(5, std::span<const std::int64_t>(patch)); });
  EXPECT_NE(m.find("cannot write rows 5..7"), std::string::npos) << m;
}

TEST_F(Hdf5Test, Bf16IsUint16BitsWithADtypeAttribute) {
  const std::string path = file("bf16.h5");
  const auto values = random_values<bf16>(64);
  {
    H5File f = H5File::create(path);
    f.write("h", values, 8, 8);
    f.write("plain", random_values<std::uint16_t>(4));
    f.write("d", random_values<double>(4));
    f.commit();
  }
  H5File f = H5File::open_read(path);
  const Dataset h = f.open_dataset("h");
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(h.attr_string("dtype"), "bf16");
  const auto bits = h.read<std::uint16_t>();  // the raw bits are readable as uint16
  ASSERT_EQ(bits.size(), values.size());
  for (std::size_t k = 0; k < bits.size(); ++k) EXPECT_EQ(bits[k], values[k].bits);
  std::string m = error_of([&] { (void)f.open_dataset("plain").read<bf16>(); });
  EXPECT_NE(m.find("holds uint16, read as bf16"), std::string::npos) << m;
  m = error_of([&] { (void)f.open_dataset("d").read<float>(); });
  EXPECT_NE(m.find("/d: holds float64, read as float32 requested"), std::string::npos) << m;
}

// ---- groups ----------------------------------------------------------------------------------

TEST_F(Hdf5Test, GroupsCreateOpenListAndRemove) {
  H5File f = H5File::create(file("groups.h5"));
  Group c = f.create_group("a/b/c");  // intermediates are created
  EXPECT_EQ(c.path(), "/a/b/c");
  f.create_group("z");
  f.write("m", random_values<float>(3));
  EXPECT_TRUE(f.exists("a"));
  EXPECT_TRUE(f.exists("a/b/c"));
  EXPECT_FALSE(f.exists("a/x/c"));  // missing intermediate: false, not an error
  EXPECT_FALSE(f.exists("q"));
  EXPECT_EQ(f.children(), (std::vector<std::string>{"a", "m", "z"}));
  EXPECT_EQ(f.kind("a/b"), NodeKind::group);
  EXPECT_EQ(f.kind("m"), NodeKind::dataset);
  EXPECT_EQ(f.open_group("a").open_group("b").children(), std::vector<std::string>{"c"});
  EXPECT_EQ(f.require_group("a/b").path(), "/a/b");
  EXPECT_EQ(f.require_group("n").path(), "/n");
  std::string m = error_of([&] { (void)f.open_group("m"); });
  EXPECT_NE(m.find("/m: is not a group"), std::string::npos) << m;
  m = error_of([&] { (void)f.open_dataset("a"); });
  EXPECT_NE(m.find("/a: is not a dataset"), std::string::npos) << m;
  m = error_of([&] { (void)c.open_dataset("missing"); });
  EXPECT_NE(m.find(file("groups.h5") + ": /a/b/c: no dataset 'missing'"), std::string::npos) << m;
  m = error_of([&] { (void)f.create_group("z"); });
  EXPECT_NE(m.find("/z: already exists"), std::string::npos) << m;
  f.remove("z");
  EXPECT_FALSE(f.exists("z"));
}

// ---- atomic files ----------------------------------------------------------------------------

TEST_F(Hdf5Test, CreateIsInvisibleUntilCommit) {
  const std::string path = file("atomic.h5");
  const auto v = random_values<float>(100);
  {
    H5File f = H5File::create(path);
    f.write("v", v);
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_TRUE(std::filesystem::exists(f.working_path()));
    EXPECT_EQ(f.working_path(), path + ".tmp." + std::to_string(::getpid()));
    f.commit();
    EXPECT_TRUE(f.committed());
    EXPECT_FALSE(std::filesystem::exists(f.working_path()));
  }
  EXPECT_EQ(entries(), std::vector<std::string>{"atomic.h5"});
  EXPECT_TRUE(same_bits(H5File::open_read(path).open_dataset("v").read<float>(), v));
}

TEST_F(Hdf5Test, UncommittedWriterLeavesNothingAndKeepsTheOldFile) {
  const std::string path = file("kept.h5");
  {
    H5File f = H5File::create(file("fresh.h5"));
    f.write("v", random_values<float>(10));
  }  // destroyed uncommitted
  EXPECT_TRUE(entries().empty());

  const auto old = random_values<std::int32_t>(10);
  {
    H5File f = H5File::create(path);
    f.write("v", old);
    f.commit();
  }
  {
    H5File f = H5File::create(path);  // would replace kept.h5 at commit
    f.write("v", random_values<std::int32_t>(3));
  }
  EXPECT_EQ(entries(), std::vector<std::string>{"kept.h5"});
  EXPECT_EQ(H5File::open_read(path).open_dataset("v").read<std::int32_t>(), old);
}

TEST_F(Hdf5Test, ObjectsOfACommittedFileRefuseUse) {
  H5File f = H5File::create(file("closed.h5"));
  Dataset d = f.write("v", random_values<float>(4));
  f.commit();
  const std::string m = error_of([&] { (void)d.read<float>(); });
  EXPECT_NE(m.find("the file is closed"), std::string::npos) << m;
  EXPECT_NE(error_of([&] { f.commit(); }).find("already committed"), std::string::npos);
}

// A writer's temporary is registered while it exists, so that a signal that stops the process at
// once removes it (core/temp_files.hpp, dist/stop_signals.hpp); committed or discarded, it is not.
TEST_F(Hdf5Test, WorkingFilesAreRegisteredAsTemporaries) {
  auto registered = [](const std::string& p) {
    const auto all = registered_temporaries();
    return std::find(all.begin(), all.end(), p) != all.end();
  };
  const std::string path = file("reg.h5");
  std::string working;
  {
    H5File f = H5File::create(path);
    working = f.working_path();
    EXPECT_TRUE(registered(working));
    f.write("v", random_values<float>(4));
    f.commit();
    EXPECT_FALSE(registered(working));
  }
  {
    H5File f = H5File::open_append(path);
    EXPECT_TRUE(registered(f.working_path()));
    remove_temporaries_now();  // what the handler of a second SIGTERM does
    EXPECT_FALSE(std::filesystem::exists(f.working_path()));
  }  // discarded: nothing left, nothing registered
  EXPECT_FALSE(registered(working));
  EXPECT_EQ(entries(), std::vector<std::string>{"reg.h5"});
}

TEST_F(Hdf5Test, OneWriterPerPathInAProcess) {
  H5File a = H5File::create(file("twice.h5"));
  const std::string m = error_of([&] { (void)H5File::create(file("twice.h5")); });
  EXPECT_NE(m.find("already open for writing in this process"), std::string::npos) << m;
}

TEST_F(Hdf5Test, ReadOnlyObjectsOutliveTheirFileHandle) {
  const auto v = random_values<std::int64_t>(5);
  {
    H5File f = H5File::create(file("ro.h5"));
    f.write("v", v);
    f.commit();
  }
  const Dataset d = H5File::open_read(file("ro.h5")).open_dataset("v");  // the H5File is a temporary
  EXPECT_EQ(d.read<std::int64_t>(), v);
  H5File f = H5File::open_read(file("ro.h5"));
  EXPECT_FALSE(f.writable());
  EXPECT_NE(error_of([&] { f.commit(); }).find("read-only"), std::string::npos);
}

TEST_F(Hdf5Test, AppendWorksOnACopyAndReplacesAtCommit) {
  const std::string path = file("results.h5");
  const auto first = random_values<double>(8);
  const auto second = random_values<double>(8);
  {
    H5File f = H5File::create(path);
    f.set_attr("schema", "test");
    f.create_group("point_0").write("x", first);
    f.commit();
  }
  {
    H5File f = H5File::open_append(path);
    f.create_group("point_1").write("x", second);
    // Not visible until commit.
    EXPECT_FALSE(H5File::open_read(path).exists("point_1"));
  }  // abandoned
  EXPECT_EQ(entries(), std::vector<std::string>{"results.h5"});
  EXPECT_FALSE(H5File::open_read(path).exists("point_1"));
  {
    H5File f = H5File::open_append(path);
    EXPECT_EQ(f.attr_string("schema"), "test");
    f.create_group("point_1").write("x", second);
    f.commit();
  }
  EXPECT_EQ(entries(), std::vector<std::string>{"results.h5"});
  H5File f = H5File::open_read(path);
  EXPECT_EQ(f.children(), (std::vector<std::string>{"point_0", "point_1"}));
  EXPECT_TRUE(same_bits(f.open_dataset("point_0/x").read<double>(), first));
  EXPECT_TRUE(same_bits(f.open_dataset("point_1/x").read<double>(), second));
}

TEST_F(Hdf5Test, AppendRefusesToClobberAConcurrentReplacement) {
  const std::string path = file("shared.h5");
  for (const char* name : {"shared.h5", "other.h5"}) {
    H5File f = H5File::create(file(name));
    f.set_attr("who", name);
    f.commit();
  }
  H5File f = H5File::open_append(path);
  f.set_attr("mine", std::int64_t{1});
  std::filesystem::rename(file("other.h5"), path);  // another writer committed meanwhile
  const std::string m = error_of([&] { f.commit(); });
  EXPECT_NE(m.find("replaced or changed by another writer"), std::string::npos) << m;
  EXPECT_EQ(H5File::open_read(path).attr_string("who"), "other.h5");
  EXPECT_EQ(entries(), std::vector<std::string>{"shared.h5"});
}

// ---- damaged and foreign files ---------------------------------------------------------------

TEST_F(Hdf5Test, TruncatedFileGivesAClearError) {
  const std::string good = file("good.h5");
  {
    H5File f = H5File::create(good);
    f.set_attr("note", random_string(100));
    DatasetOptions z;
    z.deflate = 3;
    f.write("a", random_values<float>(50000), z);
    f.create_group("g").write("b", random_values<std::int64_t>(20000));
    f.commit();
  }
  const auto size = file_size(good);
  std::vector<std::uintmax_t> cuts = {0, 1, 8, 100, 2048, size / 3, size / 2, size - 1};
  for (int k = 0; k < 4; ++k) cuts.push_back(1 + rng_() % (size - 1));
  for (const auto cut : cuts) {
    SCOPED_TRACE(cut);
    const std::string bad = file("cut.h5");
    std::filesystem::copy_file(good, bad, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(bad, cut);
    std::string m = error_of([&] { (void)H5File::open_read(bad); });
    EXPECT_EQ(m.rfind(bad + ": not a valid HDF5 file or truncated", 0), 0u) << m;
    m = error_of([&] { (void)H5File::open_append(bad); });
    EXPECT_EQ(m.rfind(bad + ": not a valid HDF5 file or truncated", 0), 0u) << m;
  }
  EXPECT_EQ(entries(), (std::vector<std::string>{"cut.h5", "good.h5"}));  // no temporaries left
}

TEST_F(Hdf5Test, ForeignAndMissingFilesGiveClearErrors) {
  const std::string text = file("notes.txt");
  std::ofstream(text) << random_string(5000);
  EXPECT_EQ(error_of([&] {
              (void)H5File::open_read(text);
            }).rfind(text + ": not a valid HDF5 file or truncated", 0),
            0u);
  const std::string missing = file("missing.h5");
  EXPECT_EQ(error_of([&] { (void)H5File::open_read(missing); }), missing + ": no such file");
  EXPECT_EQ(error_of([&] { (void)H5File::open_append(missing); }), missing + ": no such file");
  const std::string m = error_of([&] { (void)H5File::create(file("no/such/dir/x.h5")); });
  EXPECT_NE(m.find("cannot create"), std::string::npos) << m;
}

TEST_F(Hdf5Test, LibraryVersionIsReported) {
  const std::string v = hdf5_library_version();
  EXPECT_EQ(std::count(v.begin(), v.end(), '.'), 2) << v;
}

namespace {

// Reads every attribute and dataset under `g`, whatever it holds (the damaged-file test's probe).
void read_everything(const Group& g);

void read_attrs(const Object& o) {
  for (const std::string& name : o.attr_names()) {
    const AttrInfo info = o.attr_info(name);
    if (info.kind == AttrKind::integer) (void)o.attr_ints(name);
    if (info.kind == AttrKind::floating) (void)o.attr_doubles(name);
    if (info.kind == AttrKind::string) (void)o.attr_strings(name);
  }
}

void read_everything(const Group& g) {
  read_attrs(g);
  for (const std::string& child : g.children()) {
    if (g.kind(child) == NodeKind::group) {
      read_everything(g.open_group(child));
      continue;
    }
    const Dataset d = g.open_dataset(child);
    read_attrs(d);
    switch (d.dtype()) {
      case DType::i8:
        (void)d.read<std::int8_t>();
        break;
      case DType::u8:
        (void)d.read<std::uint8_t>();
        break;
      case DType::u16:
        (void)d.read<std::uint16_t>();
        break;
      case DType::bf16:
        (void)d.read<bf16>();
        break;
      case DType::i32:
        (void)d.read<std::int32_t>();
        break;
      case DType::i64:
        (void)d.read<std::int64_t>();
        break;
      case DType::f32:
        (void)d.read<float>();
        break;
      case DType::f64:
        (void)d.read<double>();
        break;
      case DType::string:
        (void)d.read_strings();
        break;
    }
  }
}

}  // namespace

// Flipped bytes anywhere in a file: reading it either works (the byte was in unused space or in
// unchecksummed contiguous data) or throws mtplab::Error; it never crashes. This holds because
// the wrapper writes the HDF5 1.10 format (checksummed metadata), fixed-length strings (no
// unchecksummed global heap) and fletcher32 on chunks.
TEST_F(Hdf5Test, CorruptedBytesGiveErrorsNotCrashes) {
  const std::string good = file("good.h5");
  {
    H5File f = H5File::create(good);
    f.set_attr("name", random_string(12));
    f.set_attr("config", random_string(70000));  // dense attribute storage
    f.set_attr("shape", random_values<std::int64_t>(4));
    f.set_attr("labels", std::vector<std::string>{random_string(4), random_string(9)});
    Group g = f.create_group("point_0/steps");
    g.set_attr("rate", 0.5);
    DatasetOptions grow;
    grow.extendable = true;
    grow.deflate = 2;
    grow.chunk = {64, 8};
    Dataset d = g.create_dataset("lat", DType::f32, 0, 8, grow);
    for (int k = 0; k < 5; ++k) d.append_rows(random_values<float>(8 * 100));
    g.write("h", random_values<bf16>(64 * 32), 64, 32, DatasetOptions{.chunk = {16, 32}});
    g.write_strings("arm", std::vector<std::string>{random_string(3), random_string(7), random_string(5)});
    f.write("plain", random_values<std::int32_t>(500));
    f.commit();
  }
  read_everything(H5File::open_read(good));
  const auto size = file_size(good);
  const std::string bad = file("bad.h5");
  int errors = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::filesystem::copy_file(good, bad, std::filesystem::copy_options::overwrite_existing);
    {
      std::fstream fs(bad, std::ios::in | std::ios::out | std::ios::binary);
      const int flips = 1 + static_cast<int>(rng_() % 4);
      for (int k = 0; k < flips; ++k) {
        fs.seekp(static_cast<std::streamoff>(rng_() % size));
        const char c = static_cast<char>(rng_());
        fs.write(&c, 1);
      }
    }
    try {
      read_everything(H5File::open_read(bad));
    } catch (const mtplab::Error& e) {
      ++errors;
      EXPECT_EQ(e.message().rfind(bad + ":", 0), 0u) << e.message();  // names the file
    }
  }
  EXPECT_GT(errors, 0);  // flips in a file this full of metadata and chunks must be caught sometimes
}
