// ckpt::base::ParseHostPort.
#include "ckpt/base/host_port.h"

#include <gtest/gtest.h>

#include <string>

namespace ckpt::base {
namespace {

TEST(HostPortTest, SplitsHostAndPortAndRefusesWhatIsNotAnAddress) {
  auto a = ParseHostPort("127.0.0.1:8080");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "127.0.0.1");
  EXPECT_EQ(a->second, 8080);
  auto b = ParseHostPort("[::1]:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "::1");
  EXPECT_FALSE(ParseHostPort("localhost").ok());
  EXPECT_FALSE(ParseHostPort(":80").ok());
  EXPECT_FALSE(ParseHostPort("host:99999").ok());
  EXPECT_FALSE(ParseHostPort("::1:80").ok());
  EXPECT_FALSE(ParseHostPort("[::1:80").ok());
  EXPECT_FALSE(ParseHostPort("host:8x").ok());
  auto bad = ParseHostPort("host:70000");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_NE(bad.status().message().find("'host:70000'"), std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace ckpt::base
